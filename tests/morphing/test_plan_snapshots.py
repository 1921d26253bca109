"""The planner's account of peer snapshots: their host memory per node, a refusal where they do not fit the
profile's host memory, and "too few nodes" where no copy can leave the node it protects."""

from __future__ import annotations

from pathlib import Path

from morphing.plan_result import Plan
from morphing.planner import Planner
from morphing.profile import Profile, parse_profile

ROOT = Path(__file__).resolve().parents[2]
SHORT = int(0.0008 * 2**30)  # the demo model's six layers do not fit on one GPU: a pipeline of two or more


def demo(host_memory_bytes: int | None = None) -> Profile:
    profile = parse_profile((ROOT / "examples" / "profiles" / "tiny_gpt.json").read_text())
    cluster = profile.cluster.model_copy(update={"host_memory_bytes": host_memory_bytes})
    return profile.model_copy(update={"cluster": cluster})


def planned(profile: Profile, nodes: list[tuple[str, int]], interval: int = 1) -> Plan:
    result = Planner(profile, 8, gpu_memory_bytes=SHORT, snapshot_interval=interval).plan(nodes)
    assert isinstance(result, Plan), result
    return result


def test_a_pipeline_with_a_lonely_stage_on_two_nodes_says_the_host_memory_its_snapshots_take() -> None:
    plan = planned(demo(), [("a", 1), ("b", 1)])
    assert plan.layout.pipeline_stages == 2 and plan.layout.data_parallel == 1, plan.layout
    verdict = Planner(demo(), 8, gpu_memory_bytes=SHORT, snapshot_interval=1).snapshots(plan.layout)
    assert verdict is not None and verdict.plan.active and not verdict.refusal
    profile = demo()
    state = sum(layer.parameter_bytes for layer in profile.layers) * (1 + profile.optimizer_bytes_per_parameter_byte)
    # each node keeps 2 copies of its own stage and 2 of the other's: the whole state twice
    assert sum(verdict.per_node.values()) == 2 * 2 * state
    assert any(n.startswith("peer snapshots: ") and "GiB of host memory" in n for n in plan.notes), plan.notes


def test_snapshots_that_do_not_fit_a_nodes_host_memory_are_refused_and_the_plan_says_so() -> None:
    plan = planned(demo(host_memory_bytes=1024), [("a", 1), ("b", 1)])
    assert any(n.startswith("peer snapshots refused: ") and "host memory on a" in n for n in plan.notes), plan.notes
    roomy = planned(demo(host_memory_bytes=2**40), [("a", 1), ("b", 1)])
    assert not any("refused" in n for n in roomy.notes), roomy.notes


def test_a_pipeline_on_one_node_says_too_few_nodes() -> None:
    plan = planned(demo(), [("a", 2)])
    assert {s.node for s in plan.layout.placement} == {"a"} and plan.layout.pipeline_stages >= 2
    assert any("too few nodes" in n for n in plan.notes), plan.notes


def test_a_job_without_snapshots_or_a_layout_with_every_stage_on_two_nodes_has_no_snapshot_note() -> None:
    assert not any("snapshot" in n for n in planned(demo(), [("a", 1), ("b", 1)], interval=0).notes)
    wide = Planner(demo(), 8, gpu_memory_bytes=SHORT, snapshot_interval=1)
    plan = wide.plan([(f"n{i}", 1) for i in range(4)], stages=2)
    assert isinstance(plan, Plan) and plan.layout.data_parallel == 2, plan
    assert not any("snapshot" in n for n in plan.notes), plan.notes
