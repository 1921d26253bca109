"""``spotmorph agent``: the worker agent daemon of one VM (or one local-cluster node)."""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from morphing.errors import UserInputError
from worker_agent.notices.facts import CLOUDS

if TYPE_CHECKING:
    from worker_agent.agent.gpus import Gpu


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--controller",
        help="HOST:PORT of the controller, or of each of several sharing one database, separated by commas "
        "(a:50051,b:50051): the agent calls the one that leads and finds the next when it does not "
        "(env SPOTMORPH_CONTROLLER, the same list)",
    )
    parser.add_argument("--token-file", type=Path, help="file holding the agent token (else SPOTMORPH_AGENT_TOKEN)")
    parser.add_argument(
        "--wait-for-token",
        default="0",
        metavar="SECONDS",
        help="wait up to this long for --token-file to appear (Azure: the controller writes each VM's own "
        "token by Run Command after the VM starts); default 0: a missing token exits 2 at once",
    )
    parser.add_argument("--name", default="", help="node name (default: the controller names it node-N)")
    parser.add_argument(
        "--slots",
        default="auto",
        help="trainer slots on this node; 'auto' (default): one per GPU found, or 1 on a node without GPUs",
    )
    parser.add_argument(
        "--gpus",
        default=os.environ.get("SPOTMORPH_GPUS") or "auto",
        help="GPUs the trainers use: 'auto' (default: every GPU found by NVML, else torch), 'none' (CPU slots), "
        "or CUDA device indices such as 0,1 (several agents on one host; env SPOTMORPH_GPUS)",
    )
    parser.add_argument("--address", default="127.0.0.1", help="address other nodes reach this node at")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=Path("/var/lib/spotmorph/agent"),
        help="the agent's own files: trainer logs and progress (default %(default)s)",
    )
    parser.add_argument(
        "--cloud",
        choices=CLOUDS,
        default="azure",
        help="whose eviction notices to watch at --imds-url: azure (Scheduled Events, the default), aws (IMDSv2: the "
        "Spot instance-action and the rebalance recommendation) or gcp (the preempted flag; a SIGTERM is taken as "
        "a notice too)",
    )
    parser.add_argument(
        "--imds-url",
        help="the cloud's metadata service, where eviction notices come from (azure and aws: http://169.254.169.254, "
        "gcp: http://metadata.google.internal); without it none are watched",
    )
    parser.add_argument("--vm-name", help="this VM's name in Azure's Scheduled Events (default: the node name)")
    parser.add_argument("--instance-id", default="", help="the provider's id for this VM")
    parser.add_argument("--ca", type=Path, help="CA certificate (mutual TLS)")
    parser.add_argument("--cert", type=Path, help="this agent's certificate (mutual TLS)")
    parser.add_argument("--key", type=Path, help="this agent's private key (mutual TLS)")
    parser.add_argument(
        "--warm-trainers",
        default=os.environ.get("SPOTMORPH_WARM_TRAINERS") or "slots",
        help="trainer processes kept started (torch imported, waiting) for the next assignment, so a morph "
        "pays no process start; 'slots' (default): one per slot, N per node, or 0 / 'off': every trainer "
        "starts cold (env SPOTMORPH_WARM_TRAINERS). Each costs about 300 MB of memory (RSS) and under 1%% of a core "
        "while it waits (docs/benchmarks.md)",
    )
    parser.add_argument(
        "--lease-seconds",
        default=os.environ.get("SPOTMORPH_LEASE_SECONDS"),
        help="how long this node's trainers keep training after the controller last answered a heartbeat; "
        "then the agent kills them, and a trainer whose lease file goes stale (a frozen agent) stops by itself "
        "(default: six times the controller's heartbeat expiry; env SPOTMORPH_LEASE_SECONDS)",
    )
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the trainers")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from worker_agent.agent import gpus as gpu_values
    from worker_agent.agent.daemon import Agent, AgentConfig
    from worker_agent.agent.zygote import InheritedProcess

    zygote = InheritedProcess.take(os.environ)  # first: nothing this process starts may inherit it
    controllers = controller_addresses(args.controller, os.environ)
    token = _token(args.token_file, _seconds("--wait-for-token", args.wait_for_token))
    warm_count(args.warm_trainers, 1)  # a bad value exits 2 before anything starts
    requested = gpu_values.parse_slots(args.slots)
    chosen = gpu_values.parse_gpu_choice(args.gpus)
    lease = _lease_seconds(args.lease_seconds)
    logging.basicConfig(
        level=args.log_level.upper(), format=f"%(asctime)s agent {args.name or socket.gethostname()} %(message)s"
    )
    gpus = _find_gpus(chosen, args.python)
    interface = _socket_interface(args.address)
    slots = gpu_values.slot_count(requested, gpus)  # more slots than GPUs exits 2
    config = AgentConfig(
        controllers=controllers,
        token=token,
        work_dir=args.work_dir,
        slots=slots,
        gpus=gpus,
        name=args.name,
        address=args.address,
        socket_interface=interface,
        instance_id=args.instance_id,
        imds_url=args.imds_url,
        cloud=args.cloud,
        vm_name=args.vm_name,
        ca=args.ca,
        cert=args.cert,
        key=args.key,
        warm_trainers=warm_count(args.warm_trainers, slots),
        trainer_python=args.python,
        lease_seconds=lease,
        zygote=zygote,
    )
    return asyncio.run(Agent(config).run())


def controller_addresses(flag: str | None, env: Mapping[str, str]) -> tuple[str, ...]:
    """``--controller``'s list, else SPOTMORPH_CONTROLLER's; none, or an empty or malformed entry, exits 2."""
    from protos.addresses import parse_addresses

    text, source = (
        (flag, "--controller") if flag is not None else (env.get("SPOTMORPH_CONTROLLER"), "SPOTMORPH_CONTROLLER")
    )
    if not text or not text.strip():
        raise UserInputError(
            "no controller address: pass --controller HOST:PORT (several: HOST:PORT,HOST:PORT) or set "
            "SPOTMORPH_CONTROLLER"
        )
    return parse_addresses(text, source)


def _lease_seconds(text: str | None) -> float | None:
    """``--lease-seconds`` (or SPOTMORPH_LEASE_SECONDS) as seconds > 0; None: derived from the heartbeat expiry."""
    if text is None or text == "":
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise UserInputError(f"--lease-seconds {text!r}: give a number of seconds > 0")
    return seconds


def _socket_interface(address: str) -> str | None:
    """The interface holding the advertised address, which trainers bind gloo and NCCL to (logged)."""
    import logging

    from worker_agent.agent.interfaces import find_interface
    from worker_agent.contract import GLOO_SOCKET as GLOO

    log = logging.getLogger("spotmorph.agent")
    interface = find_interface(address)
    if interface is None:
        log.warning("no interface here holds --address %s: gloo and NCCL pick their own", address)
    elif os.environ.get(GLOO):
        log.info("trainers keep %s=%s (set by the environment)", GLOO, os.environ[GLOO])
    else:
        log.info("trainers bind gloo and NCCL to %s, the interface of %s", interface, address)
    return interface


def warm_count(text: str, slots: int) -> int:
    """Warm trainers to keep: ``slots`` (one per slot, the default), a number, or ``off`` (= 0)."""
    if text == "slots":
        return slots
    if text == "off":
        return 0
    try:
        warm = int(text)
    except ValueError:
        raise UserInputError(f"--warm-trainers {text!r}: give 'slots', a number >= 0 or 'off'") from None
    if warm < 0:
        raise UserInputError(f"--warm-trainers {warm}: give 'slots', a number >= 0 or 'off'")
    return warm


def _find_gpus(chosen: tuple[int, ...] | None, python: str) -> tuple[Gpu, ...]:
    """The GPUs ``--gpus`` chose among those this node has; no probe at all for 'none'."""
    import logging

    from worker_agent.agent import gpu_probe, gpus

    if chosen == ():
        return ()
    found, source = gpu_probe.discover(python, os.environ)
    used = gpus.choose(found, chosen)
    log = logging.getLogger("spotmorph.agent")
    if used:
        log.info("GPUs: %s (found by %s)", gpus.describe(used), source)
    else:
        log.info("no GPU found: the slots train on the CPU")
    return used


def _seconds(flag: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= 86_400:
        raise UserInputError(f"{flag} {value!r}: give seconds from 0 to 86400")
    return seconds


def _token(path: Path | None, wait: float) -> str:
    """The agent token: ``path``'s (waiting up to ``wait`` s for it to appear), else SPOTMORPH_AGENT_TOKEN."""
    if path is None:
        token = os.environ.get("SPOTMORPH_AGENT_TOKEN", "").strip()
        if not token:
            raise UserInputError("no agent token: pass --token-file FILE or set SPOTMORPH_AGENT_TOKEN")
        return token
    deadline = time.monotonic() + wait
    said = False
    while True:
        try:
            token = path.read_text().strip()
        except FileNotFoundError:
            token = ""
        except OSError as exc:
            raise UserInputError(f"--token-file {path}: cannot read it ({exc.strerror})") from None
        if token:
            return token
        if time.monotonic() >= deadline:
            message = (
                f"--token-file {path}: no token there; give this VM its token (`spotmorph agent-token`, or the "
                "Azure provider's agent_tokens)"
            )
            if not wait:
                raise UserInputError(message)
            # Not the user's input: the token may still come (a controller down for a while); exit 75
            # (EX_TEMPFAIL), which systemd restarts, unlike 2.
            print(
                f"spotmorph agent: {message}; none came within {wait:g} s, exiting 75 to be restarted", file=sys.stderr
            )
            raise SystemExit(75)
        if not said:
            print(f"waiting up to {wait:g} s for this VM's agent token at {path}", file=sys.stderr, flush=True)
            said = True
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
