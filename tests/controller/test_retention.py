"""GONE nodes are forgotten after the retention, with the injected clock: the node list stops growing.

Before, every VM that ever registered stayed listed (3,005 nodes after 3,000 registrations). Events
stay; a name registering after its record was forgotten gets an incarnation above the forgotten one,
so the old incarnation's node token is still fenced off.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from controller.core.lifecycle import JobState, NodeState
from controller.core.model import ForgetNode, World
from controller.core.retention import forget_gone
from morphing.layout import Layout
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.conftest import Live, running
from tests.controller.helpers import FakeClock, job, node
from tests.controller.test_contract import code_of

EXPIRY = 5.0
RETENTION = 3600.0


def listed(live: Live) -> dict[str, int]:
    return {n.name: n.state for n in live.cluster().ListNodes(pb.ListNodesRequest()).nodes}


def test_gone_nodes_are_forgotten_after_the_retention_and_their_events_stay(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000.0)
    with running(tmp_path, clock, heartbeat_expiry_seconds=EXPIRY, gone_retention_seconds=RETENTION) as live:
        agent = live.agent(live.agent_token("vm-0"))
        first = agent.Register(pb.RegisterRequest(slots=1, address="127.0.0.1"))
        for vm in range(1, 30):  # a VM each: a per-VM token is one live node
            live.agent(live.agent_token(f"vm-{vm}")).Register(pb.RegisterRequest(slots=1, address="127.0.0.1"))
        clock.at += EXPIRY + 1  # no heartbeat ever came: GONE
        live.run(live.controller.runner.tick())
        assert set(listed(live).values()) == {pb.NODE_STATE_GONE} and len(listed(live)) == 30
        clock.at += RETENTION - 10  # not yet
        live.run(live.controller.runner.tick())
        assert len(listed(live)) == 30
        clock.at += 10
        live.run(live.controller.runner.tick())
        assert listed(live) == {}, "GONE nodes past the retention are still listed"
        assert live.controller.store.load()[0] == {}, "the store still holds them"
        registered = [e for e in live.controller.store.events(limit=10_000) if e.kind == "NodeRegistered"]
        assert len(registered) == 30, "the forgotten nodes' events must stay"
        again = agent.Register(pb.RegisterRequest(node_name=first.node_name, slots=1, address="127.0.0.1"))
        assert again.incarnation > first.incarnation
        old = live.agent(first.node_token)
        beat = pb.HeartbeatRequest(node_name=first.node_name, incarnation=first.incarnation)
        fenced = {grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED}
        assert code_of(lambda: old.Heartbeat(beat)) in fenced, "a forgotten incarnation's token works again"


def test_a_gone_node_is_kept_while_an_unfinished_job_names_it_and_for_the_flap_memory() -> None:
    gone = node("n1", NodeState.GONE, at=0.0)
    other = node("n2", NodeState.GONE, at=0.0)
    layout = Layout.from_dict(
        {
            "pipeline_stages": 1,
            "data_parallel": 1,
            "micro_batch_size": 1,
            "global_batch": 8,
            "stage_layers": [[0, 6]],
            "placement": [["n1", 0]],
        }
    )
    running_job = job("j1", JobState.MORPHING, layout=layout)
    world = World({"n1": gone, "n2": other}, {"j1": running_job})
    assert forget_gone(world, 100.0, 50.0, 600.0) == [], "kept for the flap memory, longer than the retention"
    assert forget_gone(world, 700.0, 50.0, 600.0) == [ForgetNode("n2", 1)], "n1 is named by an unfinished job"
    done = World(world.nodes, {"j1": job("j1", JobState.CANCELLED, layout=layout)})
    assert forget_gone(done, 700.0, 50.0, 600.0) == [ForgetNode("n1", 1), ForgetNode("n2", 1)]
