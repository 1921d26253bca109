"""Nodes report their GPUs: registration to record, store (old rows too), ListNodes and `spotmorph nodes`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from sqlalchemy import create_engine, text

from controller.core import intake
from controller.core.lifecycle import NodeState
from controller.core.model import Gpu, RecordEvent, SetNode, World
from controller.persistence.codec import node_from_dict, node_to_dict
from controller.persistence.store import MIGRATIONS, Store, migrate
from protos.spotmorph.v1 import controller_pb2 as pb
from spotmorph.cli import main
from tests.controller.conftest import Live
from tests.controller.helpers import node

H100 = "NVIDIA H100 80GB HBM3"
H100_BYTES = 85_520_809_984


def h100s(count: int) -> list[pb.Gpu]:
    return [pb.Gpu(index=i, name=H100, memory_bytes=H100_BYTES) for i in range(count)]


def test_a_registration_keeps_the_gpus_on_the_node_and_in_its_event() -> None:
    gpus = (Gpu(0, H100, H100_BYTES), Gpu(1, H100, H100_BYTES))
    record, commands = intake.register(World({}, {}), "", 2, "10.0.0.5", 5.0, gpus=gpus)
    assert record.gpus == gpus and record.state is NodeState.JOINING
    (added,) = [c for c in commands if isinstance(c, SetNode)]
    assert added.node.gpus == gpus
    event = next(c for c in commands if isinstance(c, RecordEvent))
    assert event.data["gpus"] == [{"index": i, "name": H100, "memory_bytes": H100_BYTES} for i in (0, 1)]
    assert intake.register(World({}, {}), "", 1, "10.0.0.6", 5.0)[0].gpus == ()


def test_node_rows_round_trip_with_gpus_and_rows_from_before_gpus_load_as_cpu_nodes(tmp_path: Path) -> None:
    with_gpus = replace(node("node-1", slots=2), gpus=(Gpu(0, H100, 1), Gpu(1, H100, 1)))
    assert node_from_dict(json.loads(json.dumps(node_to_dict(with_gpus)))) == with_gpus
    store = Store(tmp_path / "state.db")
    store.persist([SetNode(with_gpus)])
    store.close()
    old = node_to_dict(node("node-2"))
    old.pop("gpus")  # a row written by a controller that did not know about GPUs (schema 8 and before)
    engine = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    migrate(engine, MIGRATIONS[:8])
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO nodes VALUES ('node-2', 1, 'READY', :data)"), {"data": json.dumps(old)})
    engine.dispose()
    nodes, _jobs = Store(tmp_path / "state.db").load()
    assert nodes["node-1"] == with_gpus
    old_nodes, _jobs = Store(tmp_path / "old.db").load()  # schema 9 completed the row
    assert old_nodes["node-2"].gpus == () and old_nodes["node-2"] == node("node-2")


def test_registered_gpus_show_in_list_nodes_and_cluster_state(live: Live) -> None:
    register = pb.RegisterRequest(node_name="gpu-1", slots=2, address="127.0.0.1", gpus=h100s(2))
    live.agent(live.agent_token("vm-gpu")).Register(register)
    live.agent(live.agent_token("vm-cpu")).Register(pb.RegisterRequest(node_name="cpu-1", slots=1, address="127.0.0.1"))
    listed = {n.name: n for n in live.cluster().ListNodes(pb.ListNodesRequest()).nodes}
    assert [(g.index, g.name, g.memory_bytes) for g in listed["gpu-1"].gpus] == [
        (0, H100, H100_BYTES),
        (1, H100, H100_BYTES),
    ]
    assert not listed["cpu-1"].gpus
    state = live.cluster().GetClusterState(pb.GetClusterStateRequest())
    assert {n.name: len(n.gpus) for n in state.nodes} == {"gpu-1": 2, "cpu-1": 0}


@pytest.mark.parametrize(
    ("gpus", "field"),
    [
        ([pb.Gpu(index=0, name="A"), pb.Gpu(index=0, name="B")], "each index once"),
        ([pb.Gpu(index=0, name="")], "gpus[0].name"),
        ([pb.Gpu(index=0, name="bad\nname")], "gpus[0].name"),
        ([pb.Gpu(index=0, name="A", memory_bytes=1 << 60)], "gpus[0].memory_bytes"),
    ],
)
def test_a_registration_with_impossible_gpus_is_refused(live: Live, gpus: list[pb.Gpu], field: str) -> None:
    agent = live.agent(live.agent_token())
    with pytest.raises(grpc.RpcError) as info:
        agent.Register(pb.RegisterRequest(slots=1, address="127.0.0.1", gpus=gpus))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in (info.value.details() or "")
    assert not live.cluster().ListNodes(pb.ListNodesRequest()).nodes


def test_spotmorph_nodes_shows_a_gpus_column(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    register = pb.RegisterRequest(node_name="gpu-1", slots=2, address="127.0.0.1", gpus=h100s(2))
    live.agent(live.agent_token("vm-gpu")).Register(register)
    live.agent(live.agent_token("vm-cpu")).Register(pb.RegisterRequest(node_name="cpu-1", slots=1, address="127.0.0.1"))
    client = ["--controller", live.address, "--token", live.token("operator")]
    assert main(["nodes", *client]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "SLOTS", "GPUS", "JOB", "INCARNATION"]
    assert "2x H100 80GB HBM3" in lines[1] and lines[1].startswith("gpu-1")
    assert lines[2].split()[:4] == ["cpu-1", "JOINING", "1", "-"]
    assert main(["nodes", "--json", *client]) == 0
    shown = {n["name"]: n["gpus"] for n in json.loads(capsys.readouterr().out)}
    assert shown == {"gpu-1": [{"index": i, "name": H100, "memory_bytes": H100_BYTES} for i in (0, 1)], "cpu-1": []}
