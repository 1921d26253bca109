"""``spotmorph demo`` (what ``make demo`` runs): elastic training on a local cluster, checked exactly.

It starts a private local cluster (its own ``SPOTMORPH_HOME``, so a cluster you run is untouched),
submits the demo model in float64, evicts a node with notice through the Scheduled Events protocol,
adds a node, and ends with the morph timeline, the final loss and a comparison of the parameters
with an uninterrupted single-process run of the same job.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from controller.core.causes import MorphCause
from controller.eventlog.fact import Fact
from controller.eventlog.facts import GenerationIssued, GrowthDeclined
from controller.eventlog.kinds import EventKind
from controller.eventlog.schema import decode
from morphing.errors import UserInputError
from spotmorph.local.harness import LocalCluster, checkpoint_diff, last_step, train_reference
from worker_agent.contract import StepCompleted, events_of

TOLERANCE = 1e-9


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=500, help="optimizer steps (default 500)")
    parser.add_argument("--global-batch", type=int, default=16, help="samples per optimizer step (default 16)")
    parser.add_argument("--notice", type=float, default=15.0, help="eviction notice in seconds")
    parser.add_argument("--keep", action="store_true", help="keep the demo's files (logs, checkpoints)")


class _Demo:
    """The demo's cluster, and what it prints while it waits."""

    def __init__(self, home: Path) -> None:
        self.cluster = LocalCluster(home, poll=0.5)
        self.started = time.monotonic()
        self.shown: tuple[int, int, str] = (-1, -1, "")

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {text}", flush=True)

    def show(self, status: dict[str, Any]) -> None:
        """A progress line every 25 steps, every new generation and every state change."""
        key = (int(status["step"]) // 25, int(status["generation"]), str(status["state"]))
        if key == self.shown:
            return
        layout = status["layout"] or {}
        shape = f"{layout.get('pipeline_stages', '-')}x{layout.get('data_parallel', '-')}"
        bar = "#" * int(30 * int(status["step"]) / max(1, int(status["total_steps"])))
        starting = "  (trainers starting: torch import, model build, rendezvous)" if int(status["step"]) == 0 else ""
        self.say(
            f"{status['state']:<9} gen {status['generation']} layout {shape:<5} "
            f"step {status['step']:>4}/{status['total_steps']} [{bar:<30}]{starting}"
        )
        self.shown = key

    def follow(self, job: str, until: Any, what: str, timeout: float = 240.0) -> dict[str, Any]:
        return self.cluster.wait_status(job, until, timeout, what, seen=self.show)


def run(args: argparse.Namespace) -> int:
    if args.steps < 60 or args.global_batch < 1 or args.notice < 0:
        raise UserInputError("--steps must be >= 60, --global-batch >= 1 and --notice >= 0")
    home = Path(tempfile.mkdtemp(prefix="spotmorph-demo-"))
    demo = _Demo(home)
    try:
        return _run(demo, args)
    finally:
        down = demo.cluster.down()
        if down.returncode != 0:
            print(f"warning: spotmorph local down: {down.stderr.strip()}", file=sys.stderr)
        if args.keep:
            print(f"demo files kept in {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)


def _run(demo: _Demo, args: argparse.Namespace) -> int:
    steps, batch, cluster = args.steps, args.global_batch, demo.cluster
    checkpoints = cluster.home / "checkpoints"
    demo.say("starting a local cluster: a controller, a Scheduled Events service, 2 nodes x 2 CPU slots")
    cluster.up(nodes=2, slots=2)
    job = cluster.submit_checked(  # as a user submits: the profile checked against the model
        steps=steps,
        global_batch=batch,
        dtype="float64",
        seed=0,
        checkpoint_interval=20,
        checkpoint_dir=checkpoints,
    )
    demo.say(f"submitted {job}: the tiny GPT of examples/tiny_gpt.py, B={batch}, {steps} steps, float64")

    demo.follow(job, lambda s: s["state"] == "RUNNING" and int(s["step"]) >= steps // 5, f"step {steps // 5}")
    victim = cluster.job_nodes(job)[-1]
    demo.say(f"evicting {victim} with {args.notice:.0f}s notice (Azure Scheduled Events, served locally)")
    cluster.cli("local", "preempt", victim, "--notice", str(args.notice))
    demo.follow(job, lambda s: int(s["generation"]) >= 2 and int(s["step"]) >= steps * 2 // 5, "the morph")

    demo.say("a new node arrives; the controller grows the job after the debounce if the planner says it pays")
    before = {n["name"] for n in cluster.nodes()}
    cluster.add(1)
    arrived = sorted({n["name"] for n in cluster.nodes()} - before)

    def decided(status: dict[str, Any]) -> bool:
        return status["state"] == "SUCCEEDED" or growth_verdict(growth_said(cluster, job), arrived) is not None

    demo.follow(job, decided, "the controller's decision about the new node")
    final = demo.follow(job, lambda s: s["state"] == "SUCCEEDED", "the end")
    demo.say(growth_verdict(growth_said(cluster, job), arrived) or ended_before_growth(arrived, final))

    _timeline(cluster, job, final)
    demo.say("training the same job as one uninterrupted process (the reference) ...")
    reference = train_reference(cluster.home, steps, batch, seed=0)
    diff = checkpoint_diff(reference, checkpoints)
    same = diff["max_rel"] <= TOLERANCE and not diff["missing"]
    verdict = "EQUAL" if same else "DIFFERENT"
    demo.say(
        f"parameters and optimizer state vs the uninterrupted run: {verdict} "
        f"(max relative error {diff['max_rel']:.2e} over {diff['tensors_compared']} tensors; bound {TOLERANCE:g})"
    )
    print(
        "\nNext: `spotmorph plan --profile examples/profiles/gpt48.json --gpus 1-64 --gpus-per-node 8 "
        "--global-batch 512` asks the planner what bigger clusters would give a 5.6 B-parameter model."
    )
    return 0 if same else 1


def growth_verdict(said: Iterable[Fact], arrived: list[str]) -> str | None:
    """Whether the job grew onto the nodes that ``arrived``, and why not when it did not, from what the controller's
    event log ``said`` (a growth's ``GenerationIssued``, or its ``GrowthDeclined`` with the numbers the policy
    weighed); None while it has decided neither."""
    for fact in said:
        if isinstance(fact, GenerationIssued) and fact.morph_cause == MorphCause.GROW:
            return f"the job grew: generation {fact.generation}, layout {fact.layout} ({fact.cause})"
        if isinstance(fact, GrowthDeclined) and set(arrived) & set(fact.free_nodes):
            return f"the job did not grow onto {', '.join(fact.free_nodes)}: {fact.reason}: {fact.detail}"
    return None


def growth_said(cluster: LocalCluster, job: str) -> list[Fact]:
    """The job's generations and declined growths, in the order the controller logged them."""
    kinds = (EventKind.GENERATION_ISSUED, EventKind.GROWTH_DECLINED)
    return [decode(e["kind"], e["data"]) for e in cluster.events(job) if e["kind"] in kinds]


def ended_before_growth(arrived: list[str], final: dict[str, Any]) -> str:
    """Why no decision came: the job ended first (a node joins, beats, then waits out the debounce)."""
    return (
        f"the job did not grow onto {', '.join(arrived) or 'the new node'}: it finished at step {final['step']} "
        "before the controller weighed a growth (a growth waits for the debounce and for the warm build of the "
        "model on the new node): run the demo with more --steps to see it"
    )


def _timeline(cluster: LocalCluster, job: str, final: dict[str, Any]) -> None:
    progress = cluster.rank_progress(job)
    issued = [e.fact for e in cluster.facts(GenerationIssued, job)]
    seconds = {m["generation"]: m["seconds"] for m in final["morphs"]}
    pauses = {m["generation"]: (m["pause_seconds"], m["stalled_seconds"]) for m in final["morphs"]}
    print(
        "\nmorph timeline (paused: last step before the morph to the first after it; stalled: of that, until the"
        " first began; decided: the controller's part)"
    )
    print(
        f"  {'gen':>3}  {'layout':<18} {'resumed at':>10} {'steps lost':>10} {'paused s':>8} {'stalled s':>9}"
        f" {'decided s':>9}  cause"
    )
    for fact in issued:
        generation = fact.generation
        resumed = fact.resumed_at_step  # as status and the dashboard say: the held step of a morph through memory
        lost = max(0, last_step(progress.get(generation - 1, [])) - resumed) if generation > 1 else 0
        pause, stall = pauses.get(generation, (None, None))
        paused, stalled, decided = ("" if s is None else f"{s:.1f}" for s in (pause, stall, seconds.get(generation)))
        print(
            f"  {generation:>3}  {fact.layout:<18} {resumed:>10} {lost:>10} "
            f"{paused:>8} {stalled:>9} {decided:>9}  {fact.cause}"
        )
    last = progress.get(int(final["generation"]), [])
    losses = [e.loss for e in events_of(last, StepCompleted)]
    first_losses = [e.loss for e in events_of(progress.get(1, []), StepCompleted)]
    print(f"\n  steps lost in total: {final['steps_lost']}")
    if losses and first_losses:
        print(f"  loss: {first_losses[0]:.3f} at the first step -> {losses[-1]:.3f} at step {final['step']}")
