"""The agent's pure decisions, including the fencing invariant, without processes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker_agent.agent.converge import (
    AbortCollectives,
    Assignment,
    KillTrainer,
    RequestCheckpoint,
    RequestSalvage,
    RequestStop,
    StartTrainer,
    TrainerKey,
    TrainerStatus,
    accept,
    converge,
)


def running(job: str, gen: int, rank: int, stop_requested: bool = False) -> TrainerStatus:
    return TrainerStatus(TrainerKey(job, gen, rank), True, stop_requested=stop_requested)


def test_starts_the_assigned_ranks() -> None:
    commands = converge(Assignment("j", 1, "run", (0, 1)), [])
    assert commands == [StartTrainer(TrainerKey("j", 1, 0), 0), StartTrainer(TrainerKey("j", 1, 1), 1)]


def test_each_rank_starts_in_the_slot_the_controller_placed_it_in() -> None:
    placed = converge(Assignment("j", 1, "run", (4, 5, 6), slots=(2, 0, 1)), [running("j", 1, 5)])
    assert placed == [StartTrainer(TrainerKey("j", 1, 4), 2), StartTrainer(TrainerKey("j", 1, 6), 1)]
    mismatched = converge(Assignment("j", 1, "run", (4, 5), slots=(3,)), [])
    assert [c.slot for c in mismatched] == [0, 1]  # type: ignore[union-attr]  # by position on this node


def test_stale_generation_is_killed_before_the_new_one_starts() -> None:
    commands = converge(Assignment("j", 2, "run", (0,)), [running("j", 1, 0)])
    assert commands == [KillTrainer(TrainerKey("j", 1, 0), commands[0].reason, may_hold=True)]  # type: ignore[union-attr]
    assert "stale" in commands[0].reason  # type: ignore[union-attr]
    after = converge(Assignment("j", 2, "run", (0,)), [TrainerStatus(TrainerKey("j", 1, 0), False, -9)])
    assert after == [StartTrainer(TrainerKey("j", 2, 0), 0)]


def test_stop_is_requested_once() -> None:
    stop = Assignment("j", 1, "stop", (0, 1))
    assert converge(stop, [running("j", 1, 0), running("j", 1, 1)]) == [RequestStop("j", 1)]
    assert converge(stop, [running("j", 1, 0, True), running("j", 1, 1, True)]) == []


def test_abort_kills_and_idle_clears_the_node() -> None:
    assert all(isinstance(c, KillTrainer) for c in converge(Assignment("j", 1, "abort"), [running("j", 1, 0)]))
    assert converge(Assignment("", 0, "idle"), [running("j", 3, 0)])[0].reason.startswith("job j")  # type: ignore[union-attr]
    assert converge(None, []) == []


def test_the_checkpoint_request_counter_goes_to_the_running_generation_only() -> None:
    wanted = Assignment("j", 2, "run", (0,), checkpoint_request=3)
    assert converge(wanted, [running("j", 2, 0)]) == [RequestCheckpoint("j", 2, 3)]
    assert converge(Assignment("j", 2, "run", (0,)), [running("j", 2, 0)]) == []
    stale = converge(wanted, [running("j", 1, 0)])
    assert [type(c) for c in stale] == [KillTrainer], "no request reaches a generation that is not started yet"
    assert converge(Assignment("j", 2, "stop", (0,), checkpoint_request=3), [running("j", 2, 0, True)]) == []


def test_exited_trainers_are_not_restarted() -> None:
    exited = TrainerStatus(TrainerKey("j", 1, 0), False, 1)
    assert converge(Assignment("j", 1, "run", (0,)), [exited]) == []


def test_older_assignments_are_refused() -> None:
    current = Assignment("j", 5, "run", (0,))
    assert not accept(current, Assignment("j", 4, "run", (0,)))
    assert accept(current, Assignment("j", 5, "stop", (0,)))
    assert accept(current, Assignment("k", 1, "run", (0,)))
    assert accept(None, current)


actions = st.sampled_from(["run", "stop", "abort", "idle"])
assignments = st.builds(
    Assignment,
    st.sampled_from(["a", "b"]),
    st.integers(1, 4),
    actions,
    st.lists(st.integers(0, 3), unique=True).map(tuple),
    st.integers(0, 3),
)


@given(st.lists(assignments, min_size=1, max_size=8))
def test_two_generations_never_run_side_by_side(sequence: list[Assignment]) -> None:
    """Replay assignments, performing commands; at no point do two generations run at once."""
    trainers: dict[TrainerKey, TrainerStatus] = {}
    current: Assignment | None = None
    for incoming in sequence:
        if accept(current, incoming):
            current = incoming
        for _ in range(4):
            for command in converge(current, trainers.values()):
                if isinstance(command, StartTrainer):
                    trainers[command.key] = TrainerStatus(command.key, True)
                elif isinstance(command, KillTrainer):
                    trainers[command.key] = TrainerStatus(command.key, False, -9)
                elif isinstance(command, RequestStop):
                    for key, status in list(trainers.items()):
                        if (key.job_id, key.generation) == (command.job_id, command.generation):
                            trainers[key] = TrainerStatus(key, status.running, stop_requested=True)
            live = {(k.job_id, k.generation) for k, s in trainers.items() if s.running}
            assert len(live) <= 1
        if current is not None and current.action == "run":
            expected = {TrainerKey(current.job_id, current.generation, r) for r in current.ranks}
            assert expected <= set(trainers)


def test_a_held_generation_aborts_its_running_trainers_collectives_then_passes_the_salvage_order_on() -> None:
    held = Assignment("j", 3, "hold", (0, 1))
    assert converge(held, [running("j", 3, 0), running("j", 3, 1)]) == [AbortCollectives("j", 3)]
    ordered = Assignment("j", 3, "hold", (0, 1), salvage='{"step": 7}')
    assert converge(ordered, [running("j", 3, 1)]) == [AbortCollectives("j", 3), RequestSalvage("j", 3, '{"step": 7}')]
    exited = [TrainerStatus(TrainerKey("j", 3, 0), False, exit_code=0)]
    assert converge(ordered, exited) == [RequestSalvage("j", 3, '{"step": 7}')]  # nobody left to abort
    assert not [
        c for c in converge(Assignment("j", 3, "run", (0,)), [running("j", 3, 0)]) if isinstance(c, AbortCollectives)
    ]


def test_a_stop_that_takes_the_node_off_the_job_asks_its_trainers_to_hand_their_layers_over() -> None:
    leaving = Assignment("j", 1, "stop", (0, 1), leaving=True)
    assert converge(leaving, [running("j", 1, 0), running("j", 1, 1)]) == [RequestStop("j", 1, leaving=True)]
    kept = Assignment("j", 1, "stop", (0, 1), await_leavers=True)
    assert converge(kept, [running("j", 1, 0), running("j", 1, 1)]) == [], "the leaving nodes start it"
    noticed = converge(kept, [running("j", 1, 0)], noticed=True)
    assert noticed == [RequestStop("j", 1)], "a kept node with an eviction notice leaves too (perform says leaving)"
