"""What a trainer does before its first step that needs no model state: meet its peers, check its eval
settings, and say when its process started."""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from morphing.errors import UserInputError
from morphing.validation import MAX_LOSS, is_loss
from worker_agent.contract import GLOO_SOCKET, NCCL_SOCKET, TrainerArguments
from worker_agent.runtime.errors import NodeUnfit
from worker_agent.runtime.link.gated_store import GatedStore, StoreServer, read_key

Clock = Callable[[], float]
POLL_SECONDS = 0.01  # between connects to the store's port while its host rank starts it


def rendezvous(
    cfg: TrainerArguments, world_size: int, timeout: float, abandoned: Callable[[], bool] = lambda: False
) -> GatedStore:
    """Join the generation's namespace of the store, wait for all ranks, then start gloo (the control group;
    :mod:`worker_agent.runtime.pipeline.comm` adds the groups that move model tensors). Rank 0 serves the store on the
    rendezvous address, to ranks that prove the generation's key (:mod:`worker_agent.runtime.link.gated_store`).
    ``abandoned``: the generation was aborted meanwhile (waiting for rank 0's store gives up at once)."""
    import torch.distributed as dist

    bound = [f"{name}={os.environ[name]}" for name in (GLOO_SOCKET, NCCL_SOCKET) if name in os.environ]
    if bound:  # what the agent bound collectives to (this process's environment, not its exec-time one in /proc)
        say(f"rank {cfg.rank} of generation {cfg.generation}: collectives bound by {' '.join(bound)}")
    started = time.monotonic()
    deadline = started + max(120.0, timeout)  # the host waits for the others longer than they try to reach it
    key = rendezvous_key(cfg)
    server = StoreServer(cfg.rendezvous_host, cfg.rendezvous_port, key) if cfg.host_store else None
    if not cfg.host_store:
        wait_listening(cfg.rendezvous_host, cfg.rendezvous_port, started + max(60.0, timeout), abandoned=abandoned)
    wait = timedelta(seconds=max(60.0, timeout))
    store = GatedStore(cfg.rendezvous_host, cfg.rendezvous_port, key, wait, server)
    scoped = dist.PrefixStore(  # type: ignore[attr-defined]
        f"spotmorph/gen-{cfg.generation}/", store
    )
    if int(scoped.add("arrived", 1)) == world_size:  # the last to arrive says so; the others wait for its word
        scoped.set("all arrived", "1")
    try:
        scoped.wait(["all arrived"], timedelta(seconds=max(1.0, deadline - time.monotonic())))
    except dist.DistStoreError as exc:  # the wait timed out
        raise TimeoutError(f"rendezvous: {int(scoped.add('arrived', 0))} of {world_size} ranks arrived") from exc
    dist.init_process_group(
        "gloo", store=scoped, rank=cfg.rank, world_size=world_size, timeout=timedelta(seconds=timeout)
    )
    return store  # the caller keeps it: the process groups hold only its C++ half


def rendezvous_key(cfg: TrainerArguments) -> bytes:
    """The generation's key; a missing or malformed one is this node's fault (exit 2 naming the file)."""
    if cfg.rendezvous_key is None:
        raise NodeUnfit("no --rendezvous-key: the generation's store admits only ranks that prove its key")
    try:
        return read_key(cfg.rendezvous_key)
    except (OSError, ValueError) as exc:
        raise NodeUnfit(f"the generation's rendezvous key cannot be read: {exc}") from exc


def wait_listening(
    host: str,
    port: int,
    deadline: float,
    pause: Callable[[float], None] = time.sleep,
    clock: Clock = time.monotonic,
    abandoned: Callable[[], bool] = lambda: False,
) -> None:
    """Return once HOST:PORT accepts a connection. The store's own client backs off 0.2-0.6 s after a refused
    connect, and a generation's host rank is often told its assignment a moment after the others."""
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError as exc:
            gave_up = "the generation was aborted" if abandoned() else "" if clock() < deadline else "timed out"
            if gave_up:
                raise TimeoutError(
                    f"rendezvous: nothing listens on {host}:{port} (the generation's rank 0 hosts the store; "
                    f"{gave_up}): {exc}"
                ) from exc
        pause(POLL_SECONDS)


def check_eval(spec: Any, eval_interval: int) -> None:
    """An eval dataset, shaped as the training items, when the job evaluates (exit 2 at start-up otherwise)."""
    from worker_agent.runtime.numerics.batch import signature

    if eval_interval <= 0:
        return
    data = spec.eval_dataset
    if data is None or len(data) == 0:
        raise UserInputError(f"eval_interval={eval_interval} but the model's spec has no eval_dataset; set 0")
    if signature(data[0]) != signature(spec.dataset[0]):
        raise UserInputError(
            f"eval_dataset items ({signature(data[0])}) differ from the training items ({signature(spec.dataset[0])})"
        )


def check_eval_loss(eval_loss: float, step: int) -> None:
    """A finite eval loss beyond +-``MAX_LOSS`` is the user's mis-scaled loss, not a diverged model (inf or NaN):
    the job fails with a user error naming it, rather than every node reporting what no controller accepts."""
    if math.isfinite(eval_loss) and not is_loss(eval_loss):
        raise UserInputError(
            f"eval_loss {eval_loss:.3g} after step {step} is beyond +-{MAX_LOSS:g}: the model's loss is scaled "
            "wrongly; return each sample's mean loss (spotmorph averages over the batch)"
        )


def process_started_at() -> float | None:
    """When this process was created (unix seconds, 10 ms resolution), from /proc; None elsewhere."""
    try:
        started = int(Path("/proc/self/stat").read_text().rsplit(") ", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - started)
    except (OSError, IndexError, ValueError):
        return None


def warn(message: str) -> None:
    print(f"spotmorph trainer: warning: {message}", file=sys.stderr, flush=True)


def say(message: str) -> None:
    print(f"spotmorph trainer: {message}", file=sys.stderr, flush=True)
