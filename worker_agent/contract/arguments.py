"""How a trainer is started: its command line, and the hand-over file a warm trainer waits for.

The agent's supervisor and ``spotmorph train`` build :class:`TrainerArguments`; the trainer parses its
argv back into the same value, so a flag is spelled in one place (``to_argv``/``from_argv`` round-trip).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from worker_agent.contract.files import GenerationDir

TRAINER_MODULE = "worker_agent.runtime.process.trainer"
WARM_MODULE = "worker_agent.runtime.process.warm"
# What binds a trainer's collectives to its VM's interface (set by the agent, read by gloo and NCCL).
GLOO_SOCKET = "GLOO_SOCKET_IFNAME"
NCCL_SOCKET = "NCCL_SOCKET_IFNAME"


@dataclass(frozen=True)
class CommittedCheckpoint:
    """A checkpoint the controller committed: the one of ``step`` that generation ``generation`` wrote."""

    step: int
    generation: int

    def to_arg(self) -> str:
        return f"{self.step}:{self.generation}"

    @classmethod
    def from_arg(cls, text: str) -> CommittedCheckpoint:
        step, sep, generation = text.partition(":")
        if not (sep and step.isascii() and step.isdigit() and generation.isascii() and generation.isdigit()):
            raise argparse.ArgumentTypeError(f"{text!r} is not STEP:GENERATION (e.g. 200:3)")
        return cls(int(step), int(generation))


@dataclass(frozen=True)
class TrainerArguments:
    """One rank of one generation: its inputs, where it meets its peers, where it reports."""

    job_file: Path  # the job spec, morphing.jobspec.JobSpec as JSON
    layout_file: Path  # morphing.layout.Layout.to_dict() as JSON
    rank: int
    rendezvous: str  # HOST:PORT of the generation's rendezvous store (rank 0's node address)
    checkpoint_dir: Path
    generation: int = 0  # fencing token; namespaces the store
    control_dir: Path | None = None  # requests from the agent (worker_agent.contract.files.ControlDir)
    progress_file: Path | None = None  # JSON lines (worker_agent.contract.events)
    host_store: bool = False  # this process hosts the rendezvous store
    load_from: Path | None = None  # a checkpoint (or a checkpoint root) to start from instead of the newest
    device_index: int | None = None  # the GPU of this rank's slot (cuda:N) when the job runs on CUDA; None: 0
    # A controller generation: the job's id. The trainer raises the checkpoint dir's fence to (job, generation)
    # before it loads anything, checks it before every commit and deletion, and loads exactly ``resume``.
    fence_job: str | None = None
    resume: CommittedCheckpoint | None = None  # with fence_job: the committed checkpoint (None: from scratch)
    # A planned morph through memory: the step the previous generation stopped at and kept in its trainers'
    # memory, which this generation takes from them when every layer it needs is held (else ``resume``).
    held: CommittedCheckpoint | None = None
    # Where this trainer waits, holding its state, after a planned stop (None: it exits as before).
    hold_spool: Path | None = None
    # The generation's rendezvous key file (GenerationDir.rendezvous_key_file): the store admits only ranks that
    # prove it (worker_agent.runtime.link.gated_store). None: none given (the trainer refuses to meet its peers).
    rendezvous_key: Path | None = None

    @classmethod
    def in_generation_dir(
        cls,
        directory: GenerationDir,
        rank: int,
        rendezvous: str,
        checkpoint_dir: Path,
        host_store: bool = False,
        load_from: Path | None = None,
        generation: int | None = None,
        device_index: int | None = None,
        fence_job: str | None = None,
        resume: CommittedCheckpoint | None = None,
        held: CommittedCheckpoint | None = None,
        hold_spool: Path | None = None,
    ) -> TrainerArguments:
        """A rank whose inputs, control and progress files are those of ``directory``."""
        return cls(
            job_file=directory.job_file,
            layout_file=directory.layout_file,
            rank=rank,
            rendezvous=rendezvous,
            checkpoint_dir=checkpoint_dir,
            generation=directory.generation if generation is None else generation,
            control_dir=directory.control.path,
            progress_file=directory.progress_file(rank),
            host_store=host_store,
            load_from=load_from,
            device_index=device_index,
            fence_job=fence_job,
            resume=resume,
            held=held,
            hold_spool=hold_spool,
            rendezvous_key=directory.rendezvous_key_file,
        )

    @property
    def rendezvous_host(self) -> str:
        return self.rendezvous.rpartition(":")[0] or "127.0.0.1"

    @property
    def rendezvous_port(self) -> int:
        return int(self.rendezvous.rpartition(":")[2])

    def to_argv(self) -> list[str]:
        argv = [
            f"--job={self.job_file}",
            f"--layout={self.layout_file}",
            f"--rank={self.rank}",
            f"--rendezvous={self.rendezvous}",
            f"--generation={self.generation}",
            f"--checkpoint-dir={self.checkpoint_dir}",
        ]
        if self.control_dir is not None:
            argv.append(f"--control-dir={self.control_dir}")
        if self.progress_file is not None:
            argv.append(f"--progress={self.progress_file}")
        if self.host_store:
            argv.append("--host-store")
        if self.load_from is not None:
            argv.append(f"--load-from={self.load_from}")
        if self.device_index is not None:
            argv.append(f"--device-index={self.device_index}")
        if self.fence_job is not None:
            argv.append(f"--fence-job={self.fence_job}")
        if self.resume is not None:
            argv.append(f"--resume={self.resume.to_arg()}")
        if self.held is not None:
            argv.append(f"--held={self.held.to_arg()}")
        if self.hold_spool is not None:
            argv.append(f"--hold-spool={self.hold_spool}")
        if self.rendezvous_key is not None:
            argv.append(f"--rendezvous-key={self.rendezvous_key}")
        return argv

    def command(self, python: str) -> list[str]:
        """The cold start: a fresh interpreter running the trainer module."""
        return [python, "-m", TRAINER_MODULE, *self.to_argv()]

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None) -> TrainerArguments:
        """Parse a trainer's argv (``sys.argv[1:]`` when None); bad flags exit 2 with argparse's message."""
        args = _trainer_parser().parse_args(argv)
        _host, sep, port = str(args.rendezvous).rpartition(":")
        if not sep or not (port.isascii() and port.isdigit()):
            _trainer_parser().error(f"--rendezvous {args.rendezvous!r}: use HOST:PORT")
        if args.device_index is not None and args.device_index < 0:
            _trainer_parser().error(f"--device-index {args.device_index}: a CUDA device index is >= 0")
        if args.resume is not None and args.fence_job is None:
            _trainer_parser().error("--resume names a committed checkpoint of a controller job: give --fence-job too")
        if args.fence_job is not None and args.load_from is not None:
            _trainer_parser().error("--fence-job loads only the committed checkpoint (--resume), not --load-from")
        if args.held is not None and args.fence_job is None:
            _trainer_parser().error("--held names a controller generation's state in memory: give --fence-job too")
        return cls(
            job_file=args.job,
            layout_file=args.layout,
            rank=args.rank,
            rendezvous=args.rendezvous,
            checkpoint_dir=args.checkpoint_dir,
            generation=args.generation,
            control_dir=args.control_dir,
            progress_file=args.progress,
            host_store=args.host_store,
            load_from=args.load_from,
            device_index=args.device_index,
            fence_job=args.fence_job,
            resume=args.resume,
            held=args.held,
            hold_spool=args.hold_spool,
            rendezvous_key=args.rendezvous_key,
        )


def _trainer_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {TRAINER_MODULE}")
    parser.add_argument("--job", required=True, type=Path, help="job spec JSON (morphing.jobspec.JobSpec)")
    parser.add_argument("--layout", required=True, type=Path, help="layout JSON (Layout.to_dict)")
    parser.add_argument("--rank", required=True, type=int)
    parser.add_argument("--rendezvous", required=True, help="HOST:PORT of the generation's rendezvous store")
    parser.add_argument("--generation", type=int, default=0, help="fencing token; namespaces the store")
    parser.add_argument("--checkpoint-dir", required=True, type=Path)
    parser.add_argument("--control-dir", type=Path, help="requests from the agent: stop, checkpoint-request")
    parser.add_argument("--progress", type=Path, help="append JSON lines (step, loss, ...) to this file")
    parser.add_argument("--host-store", action="store_true", help="this process hosts the rendezvous store")
    parser.add_argument(
        "--rendezvous-key", type=Path, help="the generation's rendezvous key file (hex, readable by this user only)"
    )
    parser.add_argument(
        "--load-from", type=Path, help="checkpoint (or checkpoint root) to start from instead of the newest"
    )
    parser.add_argument(
        "--device-index", type=_device_index, help="GPU of this rank's slot (cuda:N) when the job runs on CUDA"
    )
    parser.add_argument(
        "--fence-job",
        help="a controller job's id: raise the checkpoint dir's fence to this generation before loading anything, "
        "commit and prune only while it holds, and load exactly --resume (or nothing)",
    )
    parser.add_argument(
        "--resume",
        type=CommittedCheckpoint.from_arg,
        help="STEP:GENERATION of the checkpoint the controller committed (with --fence-job; absent: from scratch)",
    )
    parser.add_argument(
        "--held",
        type=CommittedCheckpoint.from_arg,
        help="STEP:GENERATION the previous generation stopped at and holds in memory: take it from the trainers "
        "that hold it when they hold every layer, else load --resume",
    )
    parser.add_argument(
        "--hold-spool", type=Path, help="after a planned stop, keep this rank's state and wait here for the next one"
    )
    return parser


def _device_index(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU index (0, 1, ...)")
    return int(text)


@dataclass(frozen=True)
class WarmArguments:
    """A warm trainer: the spool it waits in, and the agent whose death makes it exit."""

    spool: Path
    parent: int

    def command(self, python: str) -> list[str]:
        return [python, "-m", WARM_MODULE, f"--spool={self.spool}", f"--parent={self.parent}"]

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None) -> WarmArguments:
        parser = argparse.ArgumentParser(prog=f"python -m {WARM_MODULE}")
        parser.add_argument("--spool", required=True, type=Path, help="directory the assignment appears in")
        parser.add_argument("--parent", required=True, type=int, help="exit when this process is no longer our parent")
        args = parser.parse_args(argv)
        return cls(args.spool, args.parent)


@dataclass(frozen=True)
class WarmAssignment:
    """What the supervisor hands a warm trainer: the trainer's arguments and the log to write to."""

    arguments: TrainerArguments
    log_file: Path

    def to_json(self) -> str:
        return json.dumps({"argv": self.arguments.to_argv(), "log": str(self.log_file)})

    @classmethod
    def from_json(cls, text: str) -> WarmAssignment:
        data = json.loads(text)
        return cls(TrainerArguments.from_argv([str(a) for a in data["argv"]]), Path(data["log"]))
