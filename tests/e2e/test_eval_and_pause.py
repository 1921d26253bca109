"""A real cluster trains the Hugging Face example with evaluation, one node is evicted with notice, and
``spotmorph status`` shows the training and evaluation losses the trainers computed, the pause the morph caused and how
long the last checkpoint paused training, equal to what the trainers' own progress files say; ``spotmorph logs``
shows what the trainers of both generations wrote."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from controller.eventlog import facts
from controller.eventlog.schema import logged
from spotmorph.local.cli_calls import ROOT
from spotmorph.local.harness import LocalCluster, first_event
from tests.browser import CHROMIUM, parse, rendered
from tests.runtime.test_gated_store import WILDCARDS, listening_addresses, tree
from worker_agent.contract import CheckpointWritten, EvaluationCompleted, StepCompleted

pytestmark = pytest.mark.slow

STEPS, EVAL_INTERVAL = 200, 50


# make soak; make test: each surface against a live controller (tests/controller: eval/pause API, dashboard page,
# TensorBoard, logs)
@pytest.mark.soak
def test_eval_loss_and_morph_pause_reach_spotmorph_status(cluster: LocalCluster, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    said = cluster.up(nodes=2, slots=1, tensorboard_dir=tmp_path / "tb").stdout
    # The address it prints names the reader's token, never the operator's (issue 44).
    assert f"(token: the reader's in {cluster.files.reader_token})" in said and "operator" not in said, said
    job = cluster.submit(
        ROOT / "examples" / "hf_gpt2.yaml",
        steps=STEPS,
        eval_interval=EVAL_INTERVAL,
        checkpoint_interval=EVAL_INTERVAL,
        checkpoint_dir=tmp_path / "ckpt",
        seed=3,
    )
    cluster.wait_step(job, 12, 240)
    # Nothing the cluster opened while training listens on a wildcard address (issue 44): the controller, the
    # agents, their zygotes and trainers (the store on the rendezvous address, gloo on the node's interface).
    pids = {pid for vm in cluster.vms() if vm.pid for pid in tree(vm.pid)} | {cluster.controller_pid() or 0}
    listening = listening_addresses(pids)
    assert listening and not listening & WILDCARDS, listening
    victim = cluster.job_nodes(job)[-1]
    cluster.cli("local", "preempt", victim, "--notice", "30")
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 300)
    assert final["state"] == "SUCCEEDED", final
    assert final["generation"] == 2, final

    # The evaluation: the last one, as rank 0 of the last generation computed it (every rank has the same).
    last = cluster.rank_progress(job)[2]
    evaluations = [(r.event.step, r.event.eval_loss) for r in last if isinstance(r.event, EvaluationCompleted)]
    assert evaluations[-1] == (STEPS, final["eval_loss"]) and final["eval_step"] == STEPS

    # The pause: the last step generation 1 completed (any rank) to the first generation 2 completed.
    def step_times(generation: int) -> list[float]:
        return [
            r.time
            for records in cluster.progress(job, generation).values()
            for r in records
            if isinstance(r.event, StepCompleted)
        ]

    expected = min(step_times(2)) - max(step_times(1))
    [morph] = final["morphs"]
    assert morph["generation"] == 2 and "eviction" in morph["cause"]
    assert morph["pause_seconds"] == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert morph["pause_seconds"] > 0 and morph["seconds"] >= 0
    # Of it, stalled: to the last rank (of those heard by then) beginning its first step of generation 2.
    firsts = [first for records in cluster.progress(job, 2).values() if (first := first_event(records, StepCompleted))]
    began = [at - step.step_seconds - max(step_times(1)) for at, step in firsts]
    assert min(began) - 1e-9 <= morph["stalled_seconds"] <= max(began) + 1e-9, (began, morph)
    assert 0 < morph["stalled_seconds"] < morph["pause_seconds"]

    # The last checkpoint's stall: the last step's, as the slowest rank of the last generation wrote it.
    written = [
        r.event
        for records in cluster.progress(job, 2).values()
        for r in records
        if isinstance(r.event, CheckpointWritten) and r.event.stall_seconds is not None
    ]
    stall = max(e.stall_seconds for e in written if e.step == STEPS and e.stall_seconds is not None)
    assert (final["checkpoint_stall_step"], final["checkpoint_stall_seconds"]) == (STEPS, stall), final

    # The training loss: the last step's, as every rank of the last generation computed it (the global batch's).
    losses = {r.event.step: r.event.loss for r in last if isinstance(r.event, StepCompleted)}
    assert (final["loss_step"], final["loss"]) == (STEPS, losses[STEPS]), final
    assert final["samples_per_second"] is not None and final["samples_per_second"] > 0

    shown = cluster.cli("status", job).stdout
    assert f"loss {losses[STEPS]:.4f} at step {STEPS}, " in shown and " samples/s" in shown, shown
    assert f"eval loss {final['eval_loss']:.4f} at step {STEPS}" in shown, shown
    assert f"checkpoint at step {STEPS} paused training {stall * 1e3:.1f} ms" in shown, shown
    stalled = f"({morph['stalled_seconds']:.1f} s stalled, then the first step)"
    paused = f"training paused {morph['pause_seconds']:.1f} s {stalled}"
    assert f"{paused}, decided in {morph['seconds']:.1f} s" in shown, shown
    events = cluster.events(job)
    evaluated = [e.fact.step for e in logged(events, facts.EvaluationCompleted)]
    assert evaluated[-1] == STEPS and evaluated == sorted(set(evaluated))  # each once (a beat may carry the newest)
    assert set(evaluated) <= set(range(EVAL_INTERVAL, STEPS + 1, EVAL_INTERVAL))
    assert [e.fact.generation for e in logged(events, facts.TrainingResumed)] == [2]
    progressed = [e.fact for e in logged(events, facts.TrainingProgressed)]
    assert progressed and all(losses.get(p.step, p.loss) == p.loss for p in progressed), progressed
    stalls = [e.fact for e in logged(events, facts.CheckpointStallMeasured)]
    assert stalls[-1] == facts.CheckpointStallMeasured(generation=2, step=STEPS, stall_seconds=stall)
    assert_tensorboard_shows_the_run(tmp_path / "tb" / job, cluster, job, final)
    assert_logs_show_both_generations(cluster, job)
    assert_the_dashboard_shows_the_run(cluster, job, final)  # last: it skips where there is no chromium


def assert_the_dashboard_shows_the_run(cluster: LocalCluster, job: str, final: dict[str, Any]) -> None:
    """The dashboard `local up` serves, in headless Chromium with the reader's token: the job SUCCEEDED on the
    node left, both generations in its morph timeline (the second an eviction), every loss point the one the
    trainers computed at that step, and the evaluations at the job's eval steps."""
    if CHROMIUM is None:
        pytest.skip("no chromium for the dashboard check (make install-dev installs it as root); the rest passed")
    token = cluster.files.reader_token.read_text().strip()
    page = parse(rendered(f"{cluster.files.dashboard_url()}#token={token}"))
    assert page.find("div", data_job=job) and page.find("span", **{"class": "state-SUCCEEDED"})
    timeline = [row.text for row in page.elements if row.tag == "td" and "eviction" in row.text]
    assert timeline, page.text()
    computed = {
        r.event.step: r.event.loss
        for records in cluster.rank_progress(job).values()
        for r in records
        if isinstance(r.event, StepCompleted)
    }
    points = [(int(float(c.attrs["data-step"])), float(c.attrs["data-value"])) for c in page.find("circle")]
    losses = [p for c, p in zip(page.find("circle"), points, strict=True) if c.attrs["class"] == "loss-point"]
    evals = [p for c, p in zip(page.find("circle"), points, strict=True) if c.attrs["class"] == "eval-point"]
    assert losses and all(value == computed[step] for step, value in losses), losses
    assert [step for step, _ in evals][-1] == STEPS and evals[-1][1] == final["eval_loss"], evals
    assert final["generation"] == 2 and f"generation {final['generation']}," in page.text()


def assert_logs_show_both_generations(cluster: LocalCluster, job: str) -> None:
    """`spotmorph logs`: what the trainers of both generations wrote, on both nodes, shipped by their agents to
    the controller; `--rank 0 --generation 2` shows that rank's lines only."""
    shown: list[str] = []

    def both() -> bool:
        shown[:] = cluster.cli("logs", job).stdout.splitlines()
        handed = [line for line in shown if line.startswith("[gen 1 rank ") and "handed off at step" in line]
        return len(handed) == 2 and any(line.startswith("[gen 2 rank 0 ") for line in shown)

    cluster.wait(both, 60, "both generations' trainer lines in `spotmorph logs`")
    nodes = {line.split("] ", 1)[0].split()[-1] for line in shown if line.startswith("[gen 1 ")}
    assert len(nodes) == 2, shown  # generation 1 ran on both nodes
    one = cluster.cli("logs", job, "--rank", "0", "--generation", "2").stdout.splitlines()
    assert one and all(line.startswith("[gen 2 rank 0 ") for line in one), one
    assert any("rank 0 of generation 2: resuming from " in line for line in one), one
    assert set(one) < set(shown)
    # Rank 0 prints what `spotmorph train` prints, every log_interval (10) steps: the training is in the log.
    trained = [line.split("] ", 1)[1] for line in shown if line.startswith("[gen ") and "  layout " in line]
    steps = [int(line.split()[1]) for line in trained if line.startswith("step ")]
    assert len(steps) >= STEPS // 10 and {s for s in steps if s % 10 == 0} >= {10, STEPS // 2, STEPS}, trained
    assert all(" loss " in line and " samples/s  layout " in line for line in trained), trained
    assert any(line.startswith("[gen 2 rank 0 ") and "step " in line for line in one), one


def assert_tensorboard_shows_the_run(folder: Path, cluster: LocalCluster, job: str, final: dict[str, Any]) -> None:
    """The controller's event files, read by TensorBoard's own reader: every loss point is the one the
    trainers computed at that step (as float32), the last eval is the job's, and the layout, at every logged
    step, steps from two GPUs to one after generation 2's resume step, with a text marker there."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(folder))
    board.Reload()
    computed = {
        r.event.step: r.event.loss
        for records in cluster.rank_progress(job).values()
        for r in records
        if isinstance(r.event, StepCompleted)
    }
    points = [(e.step, e.value) for e in board.Scalars("train/loss")]
    assert points and points[-1][0] == STEPS, points
    assert all(value == struct.unpack("<f", struct.pack("<f", computed[step]))[0] for step, value in points), points
    assert [e.step for e in board.Scalars("train/loss")] == sorted({e.step for e in board.Scalars("train/loss")})
    assert board.Scalars("eval/loss")[-1].step == STEPS
    assert board.Scalars("eval/loss")[-1].value == pytest.approx(final["eval_loss"], rel=1e-6)
    [marker] = [e for e in board.Tensors("morphs") if e.step > 0]
    assert marker.tensor_proto.string_val[0].decode().startswith(f"generation 2 from step {marker.step}: ")
    layout = [(e.step, e.value) for e in board.Scalars("layout/gpus")]  # at every logged step: a step function
    assert [s for s, _ in layout] == sorted({s for s, _ in layout}) and {s for s, _ in points} <= dict(layout).keys()
    assert [v for _, v in layout] == sorted((v for _, v in layout), reverse=True) and layout[0] == (0, 2.0)
    assert layout[-1][1] == 1.0 and min(s for s, v in layout if v == 1.0) >= marker.step, layout
