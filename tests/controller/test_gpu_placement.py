"""A job with ``device: cuda`` is planned only on nodes that registered GPUs, and otherwise waits saying why."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.core.lifecycle import JOB_TRANSITIONS, JobState, NodeState
from controller.core.model import Gpu, JobRecord, NodeRecord, SetJob, StartGeneration, World
from controller.core.reconcile import assignment_for
from controller.core.reconcile.devices import NO_FREE_GPU_NODE, NO_GPU_NODE, may_run_on, needs_gpus, waiting_reason
from tests.controller.helpers import job, node, spec
from tests.controller.test_reconcile import Sim

J, N = JobState, NodeState
H100 = (Gpu(0, "NVIDIA H100 80GB HBM3", 85_520_809_984), Gpu(1, "NVIDIA H100 80GB HBM3", 85_520_809_984))


def on(device: str, job_id: str = "j1", priority: int = 0) -> JobRecord:
    """A queued job asking for ``device`` (the job spec field; the update works whether or not it is declared)."""
    record = job(job_id, priority=priority)
    return replace(record, spec=record.spec.model_copy(update={"device": device}))


def gpu_node(name: str, at: float = -1.0, state: NodeState = N.READY) -> NodeRecord:
    return replace(node(name, state, slots=2, at=at), gpus=H100)


def cpu_node(name: str, at: float = -1.0) -> NodeRecord:
    return node(name, slots=2, at=at)


def sim_of(*nodes: NodeRecord, jobs: tuple[JobRecord, ...]) -> Sim:
    sim = Sim(World({n.name: n for n in nodes}, {j.id: j for j in jobs}))
    for name in sim.world.nodes:
        sim.beat(name)
    return sim


def test_only_cuda_jobs_need_gpu_nodes() -> None:
    assert needs_gpus(on("cuda").spec)
    assert not needs_gpus(on("auto").spec) and not needs_gpus(on("cpu").spec)
    assert not needs_gpus(spec())  # a spec that does not say: auto
    assert may_run_on(on("cuda"), gpu_node("g")) and not may_run_on(on("cuda"), cpu_node("c"))
    assert may_run_on(on("auto"), cpu_node("c")) and may_run_on(on("cpu"), gpu_node("g"))


def test_a_cuda_job_waits_queued_on_a_cluster_without_gpus_and_says_why() -> None:
    sim = sim_of(cpu_node("node-1"), cpu_node("node-2"), jobs=(on("cuda"),))
    sim.step()
    assert sim.job().state is J.QUEUED and sim.job().reason == NO_GPU_NODE
    assert not [c for c in sim.log if isinstance(c, StartGeneration)]
    assert all(n.job is None for n in sim.world.nodes.values())
    said = [c for c in sim.log if isinstance(c, SetJob)]
    assert len(said) == 1 and said[0].change is not None
    assert (said[0].change.source, said[0].change.target) == ("QUEUED", "QUEUED")
    assert said[0].change.cause == JOB_TRANSITIONS[(J.QUEUED, J.QUEUED)]
    assert not [c for c in sim.step(1) if isinstance(c, SetJob)]  # said once, not on every pass


def test_the_cuda_job_starts_on_the_gpu_node_when_one_registers() -> None:
    sim = sim_of(cpu_node("node-1"), jobs=(on("cuda"),))
    sim.step()
    sim.world = replace(sim.world, nodes={**sim.world.nodes, "node-2": gpu_node("node-2", at=sim.now)})
    sim.beat("node-2")
    sim.step(1)
    assert sim.job().state is J.RUNNING and sim.job().nodes == ("node-2",)
    assert sim.world.nodes["node-1"].job is None


def test_mixed_cluster_cuda_jobs_take_gpu_nodes_and_others_take_any() -> None:
    sim = sim_of(
        cpu_node("node-1", at=-3.0),
        gpu_node("node-2", at=-2.0),
        cpu_node("node-3", at=-1.0),
        jobs=(on("cuda", "j1", priority=1), on("auto", "j2")),
    )
    sim.step()
    assert set(sim.job("j1").nodes) == {"node-2"}
    assert sim.job("j2").state is J.RUNNING and set(sim.job("j2").nodes) <= {"node-1", "node-3"}


def test_a_cuda_job_waits_for_free_gpu_nodes_behind_a_busy_one() -> None:
    sim = sim_of(gpu_node("node-1"), cpu_node("node-2"), jobs=(on("cuda", "j1", priority=1), on("cuda", "j2")))
    sim.step()
    assert sim.job("j1").nodes == ("node-1",)
    assert sim.job("j2").state is J.QUEUED and sim.job("j2").reason == NO_FREE_GPU_NODE


@pytest.mark.parametrize(("device", "grows"), [("auto", True), ("cuda", False)])
def test_only_jobs_that_may_use_cpu_nodes_grow_onto_them(device: str, grows: bool) -> None:
    sim = sim_of(gpu_node("node-1"), jobs=(on(device),))
    sim.step(10)
    assert sim.job().state is J.RUNNING and sim.job().nodes == ("node-1",)
    added = {f"node-{i}": cpu_node(f"node-{i}", sim.now) for i in (2, 3, 4)}
    sim.world = replace(sim.world, nodes={**sim.world.nodes, **added})
    for name in sim.world.nodes:
        sim.beat(name)
    sim.step(1)
    sim.step(5)
    assert (sim.job().state is J.MORPHING) is grows


def test_a_cuda_job_that_loses_its_only_gpu_node_requeues_with_the_reason() -> None:
    sim = sim_of(gpu_node("node-1"), cpu_node("node-2"), jobs=(on("cuda"),))
    sim.step()
    assert sim.job().nodes == ("node-1",)
    sim.run_ranks("j1", step=5, ckpt=5)
    not_before = sim.now + 30
    sim.beat("node-1", *sim.world.observed["node-1"].ranks, notice=not_before)
    sim.step(1)
    sim.run_ranks("j1", running=False, code=0, step=5, ckpt=5)
    sim.beat("node-1", *sim.world.observed["node-1"].ranks, notice=not_before)  # heartbeats carry the notice
    sim.beat("node-2")
    sim.step(1)
    assert sim.job().state is J.QUEUED and sim.job().reason == NO_FREE_GPU_NODE  # it may yet withdraw
    assert sim.world.nodes["node-2"].job is None  # never placed on the CPU node
    sim.now += 11
    sim.beat("node-2")
    sim.step()
    assert sim.world.nodes["node-1"].state is N.GONE
    assert sim.job().state is J.QUEUED and sim.job().reason == NO_GPU_NODE


def test_waiting_reasons_count_only_nodes_that_are_still_there() -> None:
    cuda = on("cuda")
    lost = {"g": gpu_node("g", state=N.LOST), "c": cpu_node("c")}
    assert waiting_reason(cuda, lost) == NO_GPU_NODE
    joining = {"g": gpu_node("g", state=N.JOINING)}
    assert waiting_reason(cuda, joining) == NO_FREE_GPU_NODE
    assert waiting_reason(on("auto"), lost) is None


@pytest.mark.parametrize(
    ("nodes", "device"),
    [
        (("g1", "g2"), "cuda"),  # every placed node has GPUs
        (("g1", "c1"), "cpu"),  # a mix: CUDA on some ranks and gloo on others would hang
        (("c1", "c2"), "cpu"),
    ],
)
def test_auto_is_resolved_once_for_a_whole_generation(nodes: tuple[str, ...], device: str) -> None:
    made = [gpu_node(n) if n.startswith("g") else cpu_node(n) for n in nodes]
    sim = sim_of(*made, jobs=(on("auto"),))
    sim.step()
    job_now = sim.job()
    assert sorted(job_now.nodes) == sorted(nodes)
    for name in job_now.nodes:
        a = assignment_for(sim.world, name)
        assert a is not None and a.spec.device == device
    assert job_now.spec.device == "auto", "the stored spec keeps what the user asked for"
