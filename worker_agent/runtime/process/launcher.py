"""Run a layout on this machine: P x D trainer processes around a rendezvous store hosted here (loopback, a key
drawn for the run).

Each rank is a real OS process started with the same entry a worker agent uses
(:class:`worker_agent.contract.TrainerArguments`), and the run dir is laid out as one generation dir of
an agent (:class:`worker_agent.contract.GenerationDir`). A SIGINT/SIGTERM to the launcher becomes the
control dir's stop request. When one trainer fails the others are given time to notice (their
process-group timeouts) and are killed only if they overstay it; survivors that hold their last step for
a just-in-time checkpoint (:mod:`worker_agent.runtime.morph.salvage`) are asked to stop, since no controller
orders one here. On CUDA, rank ``r`` uses GPU ``r``
(its local rank), so a layout needs a GPU per rank. On the CPU the ranks are forked from the launcher,
which imported torch once for all of them (:mod:`worker_agent.runtime.process.forked`).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType

from morphing.errors import UserInputError
from morphing.jobspec import Device, JobSpec
from morphing.layout import Layout
from worker_agent.contract import ExitCode, GenerationDir, TrainerArguments
from worker_agent.runtime.link.gated_store import KEY_BYTES, StoreServer
from worker_agent.runtime.process.forked import ForkedRank, preload, read_port


@dataclass(frozen=True)
class LocalRun:
    job: JobSpec
    layout: Layout
    checkpoint_dir: Path
    run_dir: Path
    generation: int = 0
    load_from: Path | None = None
    fork: bool = True  # on the CPU, fork the ranks from this process (False: a new interpreter each)


def local_device(requested: Device, ranks: int) -> Device:
    """The device ``ranks`` local trainers use: ``auto`` is CUDA when every rank can have a GPU of its own.

    Asking for ``cuda`` without CUDA, or with fewer GPUs than ranks, is a :class:`UserInputError`.
    """
    from worker_agent.runtime.numerics.device import NO_CUDA, cuda_available

    if requested == "cpu":
        return "cpu"
    if not cuda_available():
        if requested == "cuda":
            raise UserInputError(NO_CUDA)
        return "cpu"
    import torch

    gpus = torch.cuda.device_count()
    if gpus >= ranks:
        return "cuda"
    if requested == "cuda":
        raise UserInputError(
            f"{ranks} ranks need a GPU each, but this machine has {gpus}; use fewer stages x replicas or --device cpu"
        )
    print(f"spotmorph train: {ranks} ranks but {gpus} GPU(s): running on the CPU (device auto)", file=sys.stderr)
    return "cpu"


def run_local(run: LocalRun) -> int:
    """Start every rank (rank 0 prints its training lines itself: :mod:`worker_agent.runtime.link.training_log`);
    return the :class:`ExitCode` of the run as a whole."""
    directory = GenerationDir(run.run_dir)
    directory.control.path.mkdir(parents=True, exist_ok=True)
    directory.control.clear_stop()
    directory.control.clear_abort()  # a reused --run-dir: an old order must not sever this run's ranks
    directory.job_file.write_text(run.job.model_dump_json(indent=1))
    directory.layout_file.write_text(json.dumps(run.layout.to_dict(), indent=1))
    ranks = range(run.layout.world_size)
    for rank in ranks:
        directory.progress_file(rank).unlink(missing_ok=True)

    def arguments(rank: int, port: int) -> TrainerArguments:
        return TrainerArguments.in_generation_dir(
            directory,
            rank,
            rendezvous=f"127.0.0.1:{port}",
            checkpoint_dir=run.checkpoint_dir,
            load_from=run.load_from,
            generation=run.generation,
            device_index=rank if run.job.device == "cuda" else None,
        )

    procs: list[subprocess.Popen[bytes] | ForkedRank] = []
    ports: list[int] = []  # where the forked ranks are told the store's port (the write end of a pipe each)
    if run.fork and run.job.device == "cpu":
        preload()
        for rank in ranks:
            read, write = os.pipe()
            ports.append(write)
            argv = partial(_forked_argv, arguments, rank, read)
            procs.append(ForkedRank(argv, close=tuple(ports)))  # the child keeps no write end: EOF reaches it
            os.close(read)
    # The run's store, on loopback, for the ranks that prove this run's key (a file only this user reads).
    key = secrets.token_bytes(KEY_BYTES)
    directory.write_rendezvous_key(key.hex())
    store = StoreServer("127.0.0.1", 0, key)
    port = store.address[1]
    for write in ports:
        os.write(write, f"{port}\n".encode())
        os.close(write)
    if not ports:
        for rank in ranks:
            command = arguments(rank, port).command(sys.executable)
            procs.append(subprocess.Popen(command, start_new_session=True))

    def request_stop(signum: int, frame: FrameType | None) -> None:
        directory.control.request_stop()

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _supervise(run, directory, procs)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        store.close()


def _forked_argv(arguments: Callable[[int, int], TrainerArguments], rank: int, read: int) -> list[str]:
    """In a forked rank: its trainer arguments, once the launcher says the store's port."""
    return arguments(rank, read_port(read)).to_argv()


def _supervise(run: LocalRun, directory: GenerationDir, procs: list[subprocess.Popen[bytes] | ForkedRank]) -> int:
    grace = 2 * run.job.timeout_seconds + 10
    failed_at: float | None = None
    while any([p.poll() is None for p in procs]):  # a list: poll every process, so an exit is seen at once
        if failed_at is None and any(p.returncode not in (None, ExitCode.SUCCEEDED) for p in procs):
            failed_at = time.monotonic()
            directory.control.request_stop()  # survivors holding their step for a salvage: no one salvages here
        if failed_at is not None and time.monotonic() - failed_at > grace:
            for rank, proc in enumerate(procs):
                if proc.poll() is None:
                    print(
                        f"spotmorph train: rank {rank} did not exit {grace:.0f}s after a failure; killing it",
                        file=sys.stderr,
                    )
                    proc.kill()
                    proc.wait()
        time.sleep(0.05)
    codes = [p.returncode for p in procs]
    if all(c == ExitCode.SUCCEEDED for c in codes):
        return ExitCode.SUCCEEDED
    print(f"spotmorph train: trainer exit codes by rank: {codes}", file=sys.stderr)
    return ExitCode.USER_ERROR if ExitCode.USER_ERROR in codes else ExitCode.ABORTED
