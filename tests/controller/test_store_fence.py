"""The write fence on both stores: once a standby takes the lease over, the deposed leader's writes are refused
whole (:class:`Deposed`), every decision names the epoch that committed it, and a released lease passes on at
once. On PostgreSQL, where controllers on several hosts share one database, the lease and the migration are
raced: no two holders ever share an epoch, epochs never go back, and controllers that start together on a
fresh database both find it at the newest schema."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import func, select

from controller.core.commands import AddJob, SetNodeSeq
from controller.core.leadership import Lease
from controller.core.stimulus import Stimulus
from controller.persistence import leases
from controller.persistence.leases import Deposed
from controller.persistence.schema import SCHEMA_VERSION, decisions, log_lines, log_streams
from controller.persistence.schema import leases as lease_rows
from controller.persistence.store import Store
from tests.controller.helpers import job
from tests.controller.test_logs_store import _two_generations, chunk

LONG = 30.0  # a lease that outlives the test: only a forced takeover or a release ends it
SHORT = 0.2  # the raced lease: it expires many times within the race
RACE_SECONDS = 2.0
TICK = Stimulus.tick("test")
T = TypeVar("T")


@pytest.fixture
def two(store_target: Path | str) -> Iterator[tuple[Store, Store]]:
    """Two controllers' stores on one database (for SQLite, a test's second Store on the same file)."""
    a, b = Store(store_target), Store(store_target)
    yield a, b
    a.close()
    b.close()


def lead(store: Store, holder: str, force: bool = False) -> Lease:
    """``store``'s controller takes the lease as ``holder`` and fences its writes with it."""
    taken, _ = leases.take(store.engine, holder, f"{holder}:1", LONG, force=force)
    assert taken is not None
    store.fencing = taken
    return taken


def epochs(store: Store) -> list[tuple[int, int | None]]:
    """(decision, epoch) of every decision row, in order: which leader committed what."""
    with store.engine.connect() as conn:
        query = select(decisions.c.decision, decisions.c.epoch).order_by(decisions.c.decision)
        return [(int(d), e) for d, e in conn.execute(query)]


def test_a_deposed_leaders_decision_is_refused_whole(two: tuple[Store, Store]) -> None:
    a, b = two
    mine = lead(a, "a")
    decided = a.persist([AddJob(job("job-1"), 1)], TICK)
    before = (a.load(), a.counters(), a.events(), epochs(a))
    theirs = lead(b, "b", force=True)
    assert theirs.epoch == mine.epoch + 1
    with pytest.raises(Deposed, match=f"epoch {mine.epoch}.*epoch {theirs.epoch}"):
        a.persist([AddJob(job("job-2"), 2), SetNodeSeq(7)], TICK)
    assert (a.load(), a.counters(), a.events(), epochs(a)) == before, "no event, no decision row, no counter"
    assert b.persist([AddJob(job("job-2"), 2)], TICK) == decided + 1, "the decision number was not taken either"


def test_a_deposed_leaders_logs_are_refused_whole(two: tuple[Store, Store]) -> None:
    a, b = two
    node, ranks = next(iter(_two_generations(a).items()))
    lead(a, "a")
    assert a.append_logs(node, [chunk(0, b"one\n", rank=ranks[0])], 1.0) == [4]
    lead(b, "b", force=True)
    with pytest.raises(Deposed):
        a.append_logs(node, [chunk(4, b"two\nthree\n", rank=ranks[0])], 2.0)
    assert [line.text for line in b.log_lines("job-1")] == ["one"]
    with b.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(log_lines)).scalar_one() == 1
        assert conn.execute(select(log_streams.c.offset)).scalars().all() == [4], "the stream did not move"
    assert b.append_logs(node, [chunk(4, b"two\n", rank=ranks[0])], 3.0) == [8]


def test_every_decision_records_the_epoch_that_committed_it(two: tuple[Store, Store]) -> None:
    a, b = two
    unfenced = a.persist([AddJob(job("job-1"), 1)], TICK)  # no lease: a decision of no epoch
    first = lead(a, "a")
    a.persist([AddJob(job("job-2"), 2)], TICK)
    a.persist([SetNodeSeq(3)], Stimulus.node_call("Register", "node-3", None, caller="agent"))
    second = lead(b, "b", force=True)
    b.persist([AddJob(job("job-3"), 3)], TICK)
    expected = [(unfenced, None), (unfenced + 1, first.epoch), (unfenced + 2, first.epoch)]
    assert epochs(b) == [*expected, (unfenced + 3, second.epoch)]


def test_a_released_lease_passes_on_at_the_next_epoch_at_once(two: tuple[Store, Store]) -> None:
    a, b = two
    mine = lead(a, "a")
    refused, held = leases.take(b.engine, "b", "b:1", LONG, force=False)
    assert refused is None and held == mine, "a live lease is not taken without force"
    leases.release(a.engine, mine)
    taken, now = leases.take(b.engine, "b", "b:1", LONG, force=False)
    assert taken is not None and taken == now and (taken.holder, taken.epoch) == ("b", mine.epoch + 1)
    assert leases.current(a.engine) == taken


def _contend(url: str, name: str, seed: int, until: float, taken: list[Lease]) -> None:
    """Controllers named ``name`` one after another: each takes and renews the lease; now and then one releases
    it or dies holding it, and the next (a new holder) must wait like any other for it to run out."""
    store, rng, life = Store(url), random.Random(seed), 0
    try:
        while time.monotonic() < until:
            mine, _ = leases.take(store.engine, f"{name}-{life}", name, SHORT, force=False)
            if mine is None:
                continue
            taken.append(mine)
            roll = rng.random()
            if roll < 0.05:
                leases.release(store.engine, mine)
            if roll < 0.1:
                life += 1
    finally:
        store.close()


def _watch(url: str, until: float, seen: list[Lease]) -> None:
    """Who holds the lease, as often as the database answers, until ``until``."""
    store = Store(url)
    try:
        while time.monotonic() < until:
            found = leases.current(store.engine)
            if found is not None:
                seen.append(found)
    finally:
        store.close()


def _together(*calls: Callable[[], T]) -> list[T]:
    """``calls`` on threads of their own, started together; their results, or the first exception raised."""
    start = threading.Barrier(len(calls))

    def run(call: Callable[[], T]) -> T:
        start.wait(30)
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(run, call) for call in calls]
        return [future.result(60) for future in futures]


def test_raced_takes_never_give_two_holders_one_epoch(postgres_url: str) -> None:
    """Two contenders hammer a short lease for two seconds while a third thread watches who holds it."""
    Store(postgres_url).close()  # migrated before the race starts
    until = time.monotonic() + RACE_SECONDS
    a: list[Lease] = []
    b: list[Lease] = []
    seen: list[Lease] = []
    _together(
        lambda: _contend(postgres_url, "a", 1, until, a),
        lambda: _contend(postgres_url, "b", 2, until, b),
        lambda: _watch(postgres_url, until, seen),
    )
    holders: dict[int, set[str]] = {}
    for lease in [*a, *b, *seen]:
        holders.setdefault(lease.epoch, set()).add(lease.holder)
    shared = {epoch: names for epoch, names in holders.items() if len(names) > 1}
    assert not shared, f"epochs held by two controllers: {shared}"
    for series in (a, b, seen):
        assert [lease.epoch for lease in series] == sorted(lease.epoch for lease in series), "an epoch went back"
    taken = {lease.epoch for lease in [*a, *b]}
    assert taken == set(range(1, max(taken) + 1)), "every takeover is the next epoch"
    assert len(taken) >= 3 and a and b, f"the lease changed hands too rarely to race: epochs {sorted(taken)}"


def test_first_takes_on_an_empty_lease_table_give_one_holder(postgres_url: str) -> None:
    """Controllers that start together on a fresh database: no lease row to lock yet, still one holder."""
    stores = [Store(postgres_url), Store(postgres_url)]
    try:
        for attempt in range(20):
            with stores[0].engine.begin() as conn:
                conn.execute(lease_rows.delete())
            takes = [partial(leases.take, s.engine, f"{i}-{attempt}", "x", LONG, False) for i, s in enumerate(stores)]
            got = [taken for taken, _ in _together(*takes)]
            assert sum(lease is not None for lease in got) == 1, f"attempt {attempt}: {got}"
    finally:
        for store in stores:
            store.close()


def test_controllers_that_start_together_both_find_the_newest_schema(postgres_url: str) -> None:
    """The migration takes an advisory lock: one migrates, the other waits and finds nothing left to do."""
    stores = _together(lambda: Store(postgres_url), lambda: Store(postgres_url))
    try:
        assert [store.schema_version() for store in stores] == [SCHEMA_VERSION, SCHEMA_VERSION]
    finally:
        for store in stores:
            store.close()
