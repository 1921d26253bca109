"""Pure decisions on registrations and submissions: names bound to instances, counters, idempotency keys."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from controller.core import intake
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import AddJob, SetNodeSeq, World, apply
from controller.persistence.store import MIGRATIONS, Store, migrate
from tests.controller.helpers import job, node, spec

VM = intake.instance_of("vm-1", "10.0.0.1", None)


def registered(world: World, name: str, instance: str = VM) -> World:
    return apply(world, intake.register(world, name, 1, "10.0.0.1", 0.0, instance)[1])


@pytest.mark.parametrize("state", [NodeState.JOINING, NodeState.READY, NodeState.ASSIGNED, NodeState.DRAINING])
def test_a_live_name_is_taken_over_only_by_its_own_instance(state: NodeState) -> None:
    world = registered(World({}, {}), "victim")
    world = replace(world, nodes={"victim": replace(world.nodes["victim"], state=state)})
    with pytest.raises(intake.NotOwner, match=r"belongs to instance vm-1; address 10\.0\.0\.2 may not take it over"):
        intake.register(world, "victim", 1024, "10.0.0.2", 1.0, intake.instance_of("", "10.0.0.2", None))
    with pytest.raises(intake.NotOwner):
        intake.register(world, "victim", 1, "10.0.0.1", 1.0, intake.instance_of("vm-1", "10.0.0.1", "other-cn"))
    with pytest.raises(intake.NotOwner):  # what a shared token claims never equals what a per-VM token proved
        intake.register(world, "victim", 1, "10.0.0.1", 1.0, intake.instance_of("vm-1", "10.0.0.1", None, proven=False))
    again, _ = intake.register(world, "victim", 1, "10.0.0.1", 1.0, VM)
    assert again.incarnation == 2


@pytest.mark.parametrize("state", [NodeState.LOST, NodeState.GONE])
def test_a_lost_or_gone_name_may_be_registered_by_anyone(state: NodeState) -> None:
    world = registered(World({}, {}), "victim")
    world = replace(world, nodes={"victim": replace(world.nodes["victim"], state=state)})
    other = intake.instance_of("vm-2", "10.0.0.2", None)
    assert intake.register(world, "victim", 1, "10.0.0.2", 1.0, other)[0].instance == other


def test_a_vm_is_one_live_node_another_name_is_refused_and_no_name_is_its_node() -> None:
    """One per-VM token held several live nodes (issue 21): each a capacity the controller planned on."""
    world = registered(World({}, {}), "first")
    with pytest.raises(intake.NotOwner, match=r"instance vm-1 is already node first .* one VM is one node"):
        intake.register(world, "second", 1, "10.0.0.1", 1.0, VM)
    again, _ = intake.register(world, "", 1, "10.0.0.1", 1.0, VM)  # an agent that lost its name file
    assert (again.name, again.incarnation) == ("first", 2)
    claimed = intake.instance_of("vm-1", "10.0.0.1", None, proven=False)
    world = registered(registered(world, "third", claimed), "fourth", claimed)  # a claim binds no VM
    assert world.nodes["third"].state is NodeState.JOINING and world.nodes["fourth"].state is NodeState.JOINING


@pytest.mark.parametrize("state", [NodeState.LOST, NodeState.GONE])
def test_a_vm_whose_node_is_lost_or_gone_may_register_under_a_new_name(state: NodeState) -> None:
    world = registered(World({}, {}), "first")
    world = replace(world, nodes={"first": replace(world.nodes["first"], state=state)})
    assert intake.register(world, "second", 1, "10.0.0.1", 1.0, VM)[0].name == "second"


def test_a_record_from_before_the_binding_binds_nothing() -> None:
    world = World({"old": node("old")}, {})
    assert intake.register(world, "old", 1, "h", 1.0, VM)[0].incarnation == 2


def test_the_binding_names_the_instance_else_the_address_and_the_certificate() -> None:
    assert intake.instance_of("vm-1", "10.0.0.1", None) == "instance vm-1"
    assert intake.instance_of("", "10.0.0.1", None) == "address 10.0.0.1"
    assert intake.instance_of("vm-1", "10.0.0.1", "agent-7") == "instance vm-1, certificate agent-7"
    assert intake.instance_of("", "10.0.0.1", None, proven=False) == "unverified address 10.0.0.1"


def test_generated_names_come_from_a_counter_no_requested_name_moves() -> None:
    world = registered(World({}, {}), "node-" + "9" * 58, intake.instance_of("vm-a", "h", None))
    world = registered(world, "node-2", intake.instance_of("vm-b", "h", None))
    names = []
    for vm in range(3):
        created, commands = intake.register(world, "", 1, "h", 0.0, intake.instance_of(f"vm-c{vm}", "h", None))
        assert isinstance(commands[0], SetNodeSeq)
        names.append(created.name)
        world = apply(world, commands)
    assert names == ["node-1", "node-3", "node-4"] and world.node_seq == 4


def test_names_are_matched_in_full() -> None:
    for bad in ["abc\n", "a" * 64, "-a", ""]:
        with pytest.raises(ValueError, match="node_name"):
            intake.register(World({}, {}), bad or "\n", 1, "h", 0.0)


def test_registrations_stop_at_the_live_node_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intake, "MAX_LIVE_NODES", 2)
    world = registered(registered(World({}, {}), "a"), "b", intake.instance_of("vm-2", "10.0.0.2", None))
    with pytest.raises(intake.Full):
        intake.register(world, "c", 1, "h", 0.0)
    assert intake.register(world, "a", 1, "10.0.0.1", 0.0, VM)[0].incarnation == 2  # an existing name is no new node


def test_submission_ids_keys_and_checkpoint_dirs() -> None:
    world = World({}, {}, job_seq=6)
    first, commands = intake.submit(world, spec(checkpoint_dir="/c/a"), "key-1", 5.0)
    assert first.id == "job-7" and commands == [AddJob(first, 7)] and first.idempotency_key == "key-1"
    world = apply(world, commands)
    assert world.job_seq == 7 and world.jobs["job-7"] is first
    assert intake.submit(world, spec(checkpoint_dir="/c/a"), "key-1", 6.0) == (first, [])
    with pytest.raises(intake.Taken, match="idempotency_key"):
        intake.submit(world, spec(checkpoint_dir="/c/a", steps=7), "key-1", 6.0)
    for nested in ("/c/a", "/c/a/", "/c/a/inner", "/c"):  # the same folder, one inside the other
        with pytest.raises(intake.Conflict, match="job-7"):
            intake.submit(world, spec(checkpoint_dir=nested), None, 6.0)
    assert intake.submit(world, spec(checkpoint_dir="/c/ab"), None, 6.0)[0].id == "job-8"
    for ended in (JobState.CANCELLED, JobState.SUCCEEDED, JobState.FAILED):  # its checkpoints are still there
        done = apply(world, [AddJob(replace(first, state=ended), 7)])
        with pytest.raises(intake.Conflict, match=rf"/c/a holds the checkpoints of job-7 \({ended}\); give this job"):
            intake.submit(done, spec(checkpoint_dir="/c/a/x"), None, 6.0)


def test_the_store_keeps_keys_unique_and_counters_across_restarts(store_target: Path | str) -> None:
    store = Store(store_target)
    keyed = replace(job("job-1"), idempotency_key="k")
    store.persist([AddJob(keyed, 1), SetNodeSeq(3)])
    with pytest.raises(IntegrityError):
        store.persist([AddJob(replace(job("job-2"), idempotency_key="k"), 2)])
    store.close()
    reopened = Store(store_target)
    assert reopened.counters() == (1, 3, 0) and reopened.load()[1]["job-1"] == keyed


def test_migrating_to_v4_counts_the_generated_names_already_used(tmp_path: Path) -> None:
    """SQLite only: a database of schema 3 exists only as a SQLite file (PostgreSQL came with schema 17)."""
    engine = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    migrate(engine, MIGRATIONS[:3])
    with engine.begin() as conn:
        for name in ["node-4", "node-12", "node-" + "9" * 58, "worker"]:
            conn.execute(text("INSERT INTO nodes VALUES (:n, 1, 'READY', '{}')"), {"n": name})
    engine.dispose()
    assert Store(tmp_path / "old.db").counters() == (0, 12, 0)


def test_a_deadline_already_past_on_the_controllers_clock_is_refused_naming_the_fix() -> None:
    from morphing.errors import UserInputError

    deadline = "2027-01-01T00:00:00Z"
    at = spec(deadline=deadline).deadline_seconds()
    assert at is not None
    with pytest.raises(UserInputError, match=r"passed 60 s ago on the controller's clock; set a time to come"):
        intake.submit(World({}, {}), spec(deadline=deadline), None, at + 60)
    job, commands = intake.submit(World({}, {}), spec(deadline=deadline), None, at - 60)
    assert commands and job.spec.deadline == deadline
