"""Shared test values and tools: a small profile, specs, worlds without a store, a clock, a store-read spy."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controller.core.lifecycle import JobState, NodeState
from controller.core.model import JobRecord, NodeObservation, NodeRecord, RankReport
from controller.persistence.codec import job_from_dict, job_to_dict
from controller.persistence.old_rows import (
    JOB_FIELDS_V19,
    JOB_FIELDS_V20,
    NESTED_JOB_FIELDS,
    complete_job_row,
    nest_job_row,
    renamed,
    with_keep_only,
)
from controller.persistence.store import Store
from morphing.jobspec import JobSpec
from morphing.planner import Planner
from morphing.profile import parse_profile
from scheduler.pools import PoolKind

REPO = Path(__file__).resolve().parents[2]


def served_address(process: subprocess.Popen[bytes], state: Path, log: Path, seconds: float = 60.0) -> str:
    """The address a controller process (``spotmorph controller --state-dir state``, writing ``log``) serves at,
    once it wrote it; fails showing the log if the process exits first or takes longer than ``seconds``."""
    deadline = time.monotonic() + seconds
    while not (state / "controller.addr").exists():
        assert process.poll() is None, f"controller {state.name} exited {process.returncode}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no controller.addr from {state.name} in {seconds} s:\n{log.read_text()}"
        time.sleep(0.05)
    return (state / "controller.addr").read_text().strip()


class FakeClock:
    """Time that moves only when a test moves it."""

    def __init__(self, at: float = 1000.0) -> None:
        self.at = at

    def now(self) -> float:
        return self.at


def profile_dict(layers: int = 6) -> dict[str, Any]:
    def layer(i: int) -> dict[str, Any]:
        return {
            "name": f"layer.{i}",
            "forward_seconds": {"1": 0.01, "2": 0.018, "4": 0.034},
            "backward_seconds": {"1": 0.02, "2": 0.036, "4": 0.068},
            "output_activation_bytes_per_sample": 4096,
            "parameter_bytes": 1 << 20,
            "activation_memory_bytes_per_sample": 8192,
        }

    return {
        "format": "spotmorph.profile/v1",
        "model": "test",
        "layers": [layer(i) for i in range(layers)],
        "cluster": {
            "gpu_memory_bytes": 1 << 34,
            "intra_node_bandwidth_bytes_per_second": 1e10,
            "inter_node_bandwidth_bytes_per_second": 1e9,
            "allreduce_bandwidth_bytes_per_second": 1e9,
        },
    }


def write_profile(folder: Path) -> Path:
    path = folder / "profile.json"
    path.write_text(json.dumps(profile_dict()))
    return path


def spec(**fields: Any) -> JobSpec:
    base: dict[str, Any] = {
        "name": "t",
        "entrypoint": "json:loads",
        "global_batch": 8,
        "steps": 100,
        "checkpoint_dir": "/tmp/ckpt",
        "profile": "/nonexistent/profile.json",
    }
    base.update(fields)
    return JobSpec.model_validate(base)


def planner(global_batch: int = 8) -> Planner:
    return Planner(parse_profile(json.dumps(profile_dict())), global_batch)


def node(
    name: str, state: NodeState = NodeState.READY, slots: int = 1, job: str | None = None, at: float = 0.0
) -> NodeRecord:
    return NodeRecord(name, 1, state, slots, "127.0.0.1", joined_at=at, state_since=at, job=job)


def job(
    job_id: str = "j1", state: JobState = JobState.QUEUED, priority: int = 0, at: float = 0.0, **fields: Any
) -> JobRecord:
    return JobRecord(job_id, spec(priority=priority), state, submitted_at=at, state_since=at, **fields)


def seen(at: float, *ranks: RankReport, notice: float | None = None) -> NodeObservation:
    return NodeObservation(1, at, tuple(ranks), notice)


STORE_READS = ("events", "recent_events", "generations", "event_counts", "checkpoints", "load", "schema_version")


def recording_reads(store: Store) -> list[tuple[str, threading.Thread]]:
    """Wrap the store's read methods; the list returned fills with (method, calling thread) per call."""
    calls: list[tuple[str, threading.Thread]] = []
    for name in STORE_READS:
        method: Callable[..., Any] = getattr(store, name)

        def recorded(*args: Any, _name: str = name, _method: Callable[..., Any] = method, **kwargs: Any) -> Any:
            calls.append((_name, threading.current_thread()))
            return _method(*args, **kwargs)

        setattr(store, name, recorded)
    return calls


class FakeProvider:
    """An in-memory provider for tests: instances are added and removed by the test."""

    def __init__(self, instances: frozenset[str] = frozenset(), *, fail_requests: bool = False) -> None:
        self.instances = set(instances)
        self.requested: list[int] = []  # every spot level asked for, in order
        self.on_demand: set[str] = set()  # the instances of the on-demand pool (the others are spot)
        self.requested_on_demand: list[int] = []  # every on-demand level asked for, in order
        self.released: list[str] = []
        self.fail_requests = fail_requests
        self.closed = False

    async def list_pools(self) -> dict[str, PoolKind]:
        return {name: PoolKind.ON_DEMAND if name in self.on_demand else PoolKind.SPOT for name in self.instances}

    async def list_instances(self) -> frozenset[str]:
        return frozenset(self.instances)

    async def request_capacity(self, slots: int, pool: PoolKind = PoolKind.SPOT) -> None:
        (self.requested if pool is PoolKind.SPOT else self.requested_on_demand).append(slots)
        if self.fail_requests:
            raise RuntimeError(f"cannot provide {slots} slots")

    async def release(self, name: str) -> None:
        self.released.append(name)
        self.instances.discard(name)

    async def close(self) -> None:
        self.closed = True


# The (step, generation) pairs schema 15 keeps as CheckpointRef records, each flat in older rows.
CHECKPOINT_REFS = {
    n: {"step": f"{n}_step", "generation": f"{n}_generation"} for n in ("resume", "held", "last_checkpoint")
}


def version_15_row(record: JobRecord) -> dict[str, Any]:
    """``record`` as a version 15 store kept it: its salvage named ``hold`` (schema 16 renamed it), without the
    fields schemas 19 and 20 added."""
    row = {k: v for k, v in job_to_dict(record).items() if k not in JOB_FIELDS_V19 and k not in JOB_FIELDS_V20}
    return renamed(row, "salvage", "hold")


def version_9_row(record: JobRecord) -> dict[str, Any]:
    """``record`` as a version 9 store kept it: every field flat (schemas 10 and 15 nest them)."""
    nested = version_15_row(record)
    records = NESTED_JOB_FIELDS | CHECKPOINT_REFS
    flat = {k: v for k, v in nested.items() if k not in records}
    for name, fields in records.items():
        flat |= {old: nested[name][new] for new, old in fields.items()}
    return flat


def from_old_row(row: dict[str, Any]) -> JobRecord:
    """A flat row of before version 9 (fields missing), read as the migrations leave it."""
    nested = nest_job_row(nest_job_row(complete_job_row(row)), CHECKPOINT_REFS)
    return job_from_dict(with_keep_only({**JOB_FIELDS_V19, **JOB_FIELDS_V20, **renamed(nested, "hold", "salvage")}))
