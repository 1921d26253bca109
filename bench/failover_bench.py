"""Controller failover: the leader SIGKILLed mid-training, again and again, on a durable PostgreSQL.

``python -m bench.failover_bench [--cycles 10] [--steps 500] [--first 30] [--every 20]`` starts a throwaway
PostgreSQL server on disk with fsync, synchronous_commit and full_page_writes on (a realistic commit, not the
tests' speed settings), a local cluster of 2 VMs x 2 slots and 2 controllers sharing it (default lease: 6 s,
standby poll: 1 s), and one float64 demo job. Then, ``--cycles`` times: SIGKILL the leader's process group
(``time.time()`` just before, as ``spotmorph local kill-leader`` does it, without that command's interpreter
start), wait for the ``LeaderElected`` event of the next epoch, and record

- **takeover**: the event's ``at`` (the new leader's clock when it made its first decision) minus the kill;
- **lease left**: how long the killed leader's lease still ran at the kill (its ``expires_at``, the database's
  clock, same host): the standby cannot take it sooner, so takeover - lease left is the standby's own delay
  (its poll, the takeover, reloading the state, the first decision);
- **serving**: until the job's step, asked of the new leader, went past the step it had at the kill (training
  never stopped: this is the control plane hearing the agents again);

then start the killed controller again with its recorded command line (it stands by for the next cycle), and
wait for the job to pass the next kill step. At the end the job must have SUCCEEDED with no step lost, no
restart and its first generation (a change of leader is not a morph), every epoch elected once, and its final
checkpoint must equal an uninterrupted 1-process float64 run of as many steps (max relative error <= 1e-9;
``--same-layout``, with ``--layout data-parallel``, also with an uninterrupted run of its own layout, 1x4).

Why this job (global batch 64, micro-batches of 1, the pipeline profile, 500 steps): a cycle (the takeover, then
the restart of the killed controller) takes 10-20 s on 2 shared cores, and the job must still train at the
tenth, while its result can only be held to the 1-process run's for so many steps: a layout's gradient sums
differ from that run's in the last bits, and once the demo's loss is near zero that difference grows tenfold
every ~100 steps. At the e2e tests' batch of 16, 1x4 data-parallel: max relative error 3.9e-11 at step 900,
1.8e-10 at 1000, 7.3e-10 at 1100, 1.5e-9 at 1200, 1.6 at 3000 (worst in Adam's ``exp_avg``), and an
uninterrupted 1x4 run gives the same figures; at batch 32 it passes 1e-9 near step 950. That 1x4 job does
110-230 steps a cycle here, too many for ten. The chaos test's pipeline profile
(``spotmorph.local.unplanned.pipeline_profile``: the same demo model, so the same reference) makes the planner
run it 2x2 across both VMs, and 64 samples in micro-batches of 1 give each rank 32 micro-batches a step: about
30 steps a cycle here, the tenth kill near step 320. ``--layout data-parallel``, ``--batch`` and
``--micro-batch 0`` (the planner's) choose otherwise; give ``--cycles`` or ``--steps`` that fit.
Prints each cycle, p50 / p99 / max of the takeover and serving times, and the lease settings; exits 1 when a
check fails. Everything lives in a temporary directory (its own SPOTMORPH_HOME); the cluster is brought down
and the server stopped whatever happens.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import machine
from controller.app.settings import ControllerSettings
from controller.eventlog.facts import InvariantViolated, LeaderElected
from controller.eventlog.schema import logged
from controller.persistence import leases
from controller.persistence.store import Store
from spotmorph.local import controllers
from spotmorph.local.cli_calls import ask
from spotmorph.local.harness import LocalCluster, checkpoint_diff, max_rel_diff, train_reference
from spotmorph.local.postgres import PostgresServer
from spotmorph.local.processes import read_pid, wait_for
from spotmorph.local.unplanned import pipeline_profile

SEED, INTERVAL = 7, 20  # the e2e tests' job (tests/e2e/test_elastic.py), whose global batch is 16
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
POLL = 0.1  # seconds between two looks at the event log or the job's status while a takeover is timed
GOAL_SECONDS = 10.0


@dataclass(frozen=True)
class Cycle:
    killed: str  # the address of the controller SIGKILLed
    elected: str  # the address of the new leader
    epoch: int  # the new leader's
    step_at_kill: int
    lease_left: float  # seconds the killed leader's lease still ran at the kill
    taken: float  # seconds from the kill to the new leader's log line STANDBY -> LEADING (NaN: not found)
    takeover: float  # seconds from the kill to the new leader's first decision (LeaderElected's ``at``)
    serving: float  # seconds from the kill to the job's step, as the new leader reports it, past step_at_kill
    restart: float  # seconds to start the killed controller again until it stands by


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def lease_taken_at(cluster: LocalCluster, address: str, epoch: int) -> float:
    """When the controller at ``address`` logged that it took the lease at ``epoch`` (its log's local time, to the
    millisecond; NaN when no such line is found)."""
    line = f"{address}: STANDBY -> LEADING (lease_taken, epoch {epoch})"
    for files in cluster.files.controllers():
        if not files.log.exists():
            continue
        for text in files.log.read_text(errors="replace").splitlines():
            if text.endswith(line):
                return datetime.strptime(text[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return math.nan


class Failovers:
    """One cluster on one database, and the cycles of kill, takeover and restart run on it."""

    def __init__(self, cluster: LocalCluster, database: str) -> None:
        self.cluster = cluster
        self.store = Store(database)  # to read the lease as it stands once the leader is dead
        self.seq = 0  # the newest event sequence number read

    def query(self, address: str, *args: str) -> Any:
        """``spotmorph ARGS --json`` asked of the controller at ``address`` only (None when it does not answer)."""
        out = ask([*args, "--json"], address, self.cluster.context().token(), check=False)
        if out.returncode != 0:
            return None
        return out.stdout

    def status(self, address: str, job: str) -> dict[str, Any] | None:
        out = self.query(address, "status", job)
        return None if out is None else dict(json.loads(out))

    def new_events(self, address: str) -> list[dict[str, Any]]:
        out = self.query(address, "events", "--after", str(self.seq))
        if out is None:
            return []
        events = [json.loads(line) for line in out.splitlines() if line.strip()]
        if events:
            self.seq = max(self.seq, *(int(e.get("seq") or 0) for e in events))
        return events

    def cycle(self, job: str) -> Cycle:
        files = self.cluster.files
        leader = controllers.leader(files)
        if leader is None:
            raise RuntimeError("no controller of this cluster leads before the kill")
        pid = read_pid(leader.files.pid_file)
        if pid is None:
            raise RuntimeError(f"controller {leader.index} has no pid file")
        survivors = [a for a in self.cluster.context().addresses() if a != leader.lease.address]
        before = self.status(leader.lease.address, job)
        if before is None:
            raise RuntimeError(f"the leader {leader.lease.address} does not answer before the kill")
        step_at_kill = int(before["step"])
        self.new_events(survivors[0])  # skip what was logged before the kill
        killed_at = time.time()
        os.killpg(pid, signal.SIGKILL)  # as `spotmorph local kill-leader` (controllers.kill_leader) does
        # Read again now: the leader may have renewed it since it was read above (every 2 s), and cannot any more.
        lease = leases.current(self.store.engine)
        if lease is None or lease.epoch != leader.lease.epoch:
            raise RuntimeError(f"the lease right after the kill of epoch {leader.lease.epoch}'s leader: {lease}")
        lease_left = lease.expires_at - killed_at
        elected: list[Any] = []

        def takeover() -> bool:
            for address in survivors:
                found = [
                    e for e in logged(self.new_events(address), LeaderElected) if e.fact.epoch > leader.lease.epoch
                ]
                if found:
                    elected.extend(found)
                    return True
            return False

        wait_for(takeover, 60, f"a LeaderElected past epoch {leader.lease.epoch}", poll=POLL)
        event = elected[0]
        if event.fact.epoch != leader.lease.epoch + 1 or event.fact.previous != leader.lease.address:
            raise RuntimeError(f"the takeover after epoch {leader.lease.epoch} ({leader.lease.address}): {event}")

        def served() -> bool:
            status = self.status(event.fact.address, job)
            return status is not None and (int(status["step"]) > step_at_kill or status["state"] != "RUNNING")

        wait_for(served, 60, f"the new leader to report a step past {step_at_kill}", poll=POLL)
        serving = time.time() - killed_at

        restarted = time.monotonic()
        leader.files.address_file.unlink(missing_ok=True)  # written again once it stands by (after its lease look)
        controllers.start(leader.files, self.cluster.env)
        wait_for(leader.files.address_file.exists, 60, f"controller {leader.index} to stand by", log=leader.files.log)
        if self.status(leader.lease.address, job) is None:
            raise RuntimeError(f"the restarted controller {leader.lease.address} does not answer")
        return Cycle(
            killed=leader.lease.address,
            elected=event.fact.address,
            epoch=event.fact.epoch,
            step_at_kill=step_at_kill,
            lease_left=lease_left,
            taken=lease_taken_at(self.cluster, event.fact.address, event.fact.epoch) - killed_at,
            takeover=event.at - killed_at,
            serving=serving,
            restart=time.monotonic() - restarted,
        )


def keep_logs(cluster: LocalCluster, out: Path) -> None:
    """The controllers' logs and the event log as ``spotmorph events`` shows it, copied into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for index, files in enumerate(cluster.files.controllers(), 1):
        if files.log.exists():
            shutil.copyfile(files.log, out / f"controller-{index}.log")
    (out / "events.txt").write_text(cluster.event_log())


def run(args: argparse.Namespace, folder: Path) -> tuple[list[Cycle], dict[str, Any], list[str]]:
    """The cycles, the job's final status and what failed (empty: every check held)."""
    parent = Path(args.database_dir) if args.database_dir else Path(tempfile.gettempdir())
    server = PostgresServer.start(settings=DURABLE, parent=parent)
    cluster = LocalCluster(folder / "home", poll=0.3)
    cycles: list[Cycle] = []
    failed: list[str] = []
    failovers: Failovers | None = None
    try:
        with server.connect() as connection:
            shown = {k: connection.execute(f"SHOW {k}").fetchone() for k in DURABLE}
        print(
            f"PostgreSQL {server.version} in {server.directory}: "
            + ", ".join(f"{k}={v[0]}" for k, v in shown.items() if v)
        )
        url = server.create_database("failover")
        cluster.up(nodes=2, controllers=2, database=url)
        failovers = Failovers(cluster, url)
        job = cluster.submit(
            steps=args.steps,
            global_batch=args.batch,
            seed=SEED,
            dtype="float64",
            checkpoint_interval=INTERVAL,
            checkpoint_dir=folder / "ckpt",
            **({"profile": pipeline_profile(folder / "profile.json")} if args.layout == "pipeline" else {}),
            **({"micro_batch_size": args.micro_batch} if args.micro_batch else {}),
        )
        first = cluster.wait_step(job, args.first, 600)
        generation = int(first["generation"])
        print(
            f"job {job}: {args.steps} steps, global batch {args.batch}, micro-batch {args.micro_batch or 'planned'}, "
            f"layout {first['layout']['pipeline_stages']}x{first['layout']['data_parallel']}, generation {generation}"
        )
        target = args.first
        for index in range(args.cycles):
            status = cluster.wait_step(job, target, 600)
            if status["state"] != "RUNNING":
                failed.append(f"the job was {status['state']} at step {status['step']} before cycle {index + 1}")
                break
            cycle = failovers.cycle(job)
            cycles.append(cycle)
            print(
                f"cycle {index + 1:2d}: killed {cycle.killed} at step {cycle.step_at_kill}, lease left "
                f"{cycle.lease_left:.2f} s; lease taken after {cycle.taken:.2f} s, {cycle.elected} elected "
                f"(epoch {cycle.epoch}) after {cycle.takeover:.2f} s, step past {cycle.step_at_kill} after "
                f"{cycle.serving:.2f} s; restarted in {cycle.restart:.1f} s",
                flush=True,
            )
            target = max(cycle.step_at_kill + args.every, int(cluster.status(job)["step"]) + 1)
        final = cluster.wait_state(job, {"SUCCEEDED", "FAILED", "CANCELLED"}, 900)
        failed += checks(cluster, final, generation, len(cycles))
        if failed:
            print(cluster.failure_report())
    except BaseException:
        print(cluster.failure_report(), file=sys.stderr)
        raise
    finally:
        if failovers is not None:
            failovers.store.close()
        if args.logs:
            keep_logs(cluster, Path(args.logs))
        cluster.down()
        server.stop()
    if final["state"] == "SUCCEEDED":
        failed += against_references(args, folder, final)
    return cycles, final, failed


def checks(cluster: LocalCluster, final: dict[str, Any], generation: int, cycles: int) -> list[str]:
    """What the job's end and the event log say went wrong (empty: nothing): a step lost, a morph, an epoch
    elected twice or skipped, a broken invariant."""
    failed = []
    elected = [(e.fact.epoch, e.fact.address) for e in cluster.facts(LeaderElected)]
    violated = cluster.facts(InvariantViolated)
    if final["state"] != "SUCCEEDED":
        failed.append(f"the job ended {final['state']}: {final.get('reason', '')}")
    if final["steps_lost"] != 0 or final.get("restarts", 0) != 0:
        failed.append(f"steps lost {final['steps_lost']}, restarts {final.get('restarts')}")
    if int(final["generation"]) != generation:
        failed.append(f"generation {generation} -> {final['generation']} (morphs: {final.get('morphs')})")
    if [epoch for epoch, _ in elected] != list(range(1, cycles + 2)):
        failed.append(f"the epochs elected: {elected}")
    if violated:
        failed.append(f"InvariantViolated: {[v.fact.invariants for v in violated]}")
    return failed


def against_references(args: argparse.Namespace, folder: Path, final: dict[str, Any]) -> list[str]:
    """The final checkpoint against the 1x1 reference (and, with --same-layout, an uninterrupted run of its
    layout); recorded in ``final``."""
    references = Path(args.references) if args.references else folder / "references"
    diff = max_rel_diff(train_reference(references, args.steps, args.batch, SEED), folder / "ckpt")
    print(f"final checkpoint against the 1x1 reference of {args.steps} steps: max relative error {diff:.3g}")
    final["max_rel_diff"] = diff
    if args.same_layout and int(final["layout"]["pipeline_stages"]) == 1:
        width = int(final["layout"]["data_parallel"])
        same = train_reference(references, args.steps, args.batch, SEED, replicas=width)
        exact = checkpoint_diff(same, folder / "ckpt")
        print(
            f"against an uninterrupted 1x{width} run: max relative error {exact['max_rel']:.3g}, "
            f"{len(exact['not_bitwise'])} of {exact['tensors_compared']} tensors not bitwise equal"
        )
    return [] if diff <= 1e-9 else [f"max relative error {diff:.3g} > 1e-9"]


def summary(cycles: Sequence[Cycle]) -> str:
    settings = ControllerSettings.model_fields
    lease = float(settings["lease_seconds"].default)
    poll = float(settings["standby_poll_seconds"].default)
    lines = [
        f"lease_seconds {lease:g} (renewed every {lease / 3:g} s), standby_poll_seconds {poll:g}: expected takeover "
        f"{lease - lease / 3:g}..{lease + poll:g} s plus the takeover's own work",
        "| over N runs | p50 (s) | p99 (s) | max (s) |",
        "|---|---|---|---|",
    ]
    for name, values in (
        ("lease left at the kill", [c.lease_left for c in cycles]),
        ("kill -> the standby takes the lease (its log)", [c.taken for c in cycles]),
        ("kill -> LeaderElected (first decision)", [c.takeover for c in cycles]),
        ("lease's end -> first decision", [c.takeover - c.lease_left for c in cycles]),
        ("lease taken -> first decision (reload, commit)", [c.takeover - c.taken for c in cycles]),
        ("kill -> step past the kill's, from the new leader", [c.serving for c in cycles]),
    ):
        p50, p99 = statistics.median(values), percentile(values, 99)
        lines.append(f"| {name} ({len(values)}) | {p50:.2f} | {p99:.2f} | {max(values):.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10, help="leaders killed (default 10)")
    parser.add_argument("--steps", type=int, default=500, help="the job's steps: enough for every cycle (see above)")
    parser.add_argument("--batch", type=int, default=64, help="global batch (default 64; the e2e tests' is 16)")
    parser.add_argument("--micro-batch", type=int, default=1, help="micro-batch size (default 1; 0: the planner's)")
    parser.add_argument(
        "--layout", choices=("pipeline", "data-parallel"), default="pipeline", help="the job's profile (see above)"
    )
    parser.add_argument("--first", type=int, default=30, help="the step of the first kill")
    parser.add_argument("--every", type=int, default=20, help="steps from one kill to the next, at least")
    parser.add_argument("--database-dir", default=None, help="where the server's data lives (default: the temp dir)")
    parser.add_argument("--references", default=None, help="a folder to keep the 1x1 reference run in, for reuse")
    parser.add_argument(
        "--same-layout", action="store_true", help="also compare with an uninterrupted 1xD run (a data-parallel layout)"
    )
    parser.add_argument("--logs", default=None, help="a folder to copy the controllers' logs and event log into")
    args = parser.parse_args(argv)
    print(machine())
    with tempfile.TemporaryDirectory(prefix="failover-bench-") as folder:
        cycles, final, failed = run(args, Path(folder))
    print(
        f"job {final['state']}: step {final['step']}, steps lost {final['steps_lost']}, restarts "
        f"{final.get('restarts')}, generation {final['generation']}, max_rel_diff {final.get('max_rel_diff')}"
    )
    if cycles:
        print(summary(cycles))
        worst = max(c.takeover for c in cycles)
        verdict = "met" if worst <= GOAL_SECONDS else "MISSED"
        print(f"goal: first decision within {GOAL_SECONDS:g} s of the kill: {verdict} (worst {worst:.2f} s)")
    if len(cycles) < args.cycles:
        failed.append(f"only {len(cycles)} of {args.cycles} cycles ran: give more --steps")
    for line in failed:
        print(f"FAILED: {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
