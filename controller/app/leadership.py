"""The controller's side of the lease: take it or stand by, renew it, step down in time, release it at stop.

Decisions are :mod:`controller.core.leadership`'s; this runs them against the store on a worker thread
(a database that hangs must not hold the event loop) and tells the controller when its role changes.
A leader renews every third of the lease and steps down on its own clock a third before the lease can run
out, whether the renewals fail (the database is cut off) or hang. Renewals and the deadline each have a
thread of their own (:meth:`Leadership._renew_forever`, :meth:`Leadership._watch`): a long decision, or a
database write cut off mid-way, holds the event loop for seconds, and must neither cost the lease nor keep
the controller leading past its deadline; a renewal that hangs must not keep the deadline from being seen.
A standby tries to take the lease at every poll and, meanwhile, reloads what it answers reads from.

A SQLite store is one controller's (the state directory's lock): it leads from the start, taking over any
lease a previous process of the same directory left, at the next epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from controller.core.leadership import ControllerRole, Lease, RoleCause, RoleChange, change_role, step_down_at
from controller.persistence import leases
from controller.persistence.store import Store
from controller.providers.base import Clock

log = logging.getLogger("spotmorph.controller")

RoleHook = Callable[[RoleChange], Awaitable[None]]


@dataclass(frozen=True)
class LeaseTiming:
    seconds: float = 6.0  # how long a lease lasts after its last renewal (the database's clock)
    poll_seconds: float = 1.0  # a standby's look at the lease

    @property
    def renew_seconds(self) -> float:
        return self.seconds / 3

    @property
    def margin_seconds(self) -> float:
        return self.seconds / 3


class Leadership:
    """One controller's role. ``on_change`` runs (awaited, in order) for every change of role."""

    def __init__(self, store: Store, address: str, timing: LeaseTiming, clock: Clock, on_change: RoleHook) -> None:
        self.store = store
        self.address = address  # may be set once bound, before start()
        self.holder = ""
        self.timing = timing
        self.clock = clock
        self.on_change = on_change
        self.role = ControllerRole.STARTING
        self.lease: Lease | None = None  # ours, while leading
        self.seen: Lease | None = None  # the lease as last read: whose it is
        self.previous = ""  # the address the lease named before this controller took it ('' when unknown or none)
        self._deadline = 0.0  # when a leader must have stepped down, unless renewed before
        self._task: asyncio.Task[None] | None = None
        self._changing = asyncio.Lock()  # the hooks of role changes run one at a time, in order
        self._role_lock = threading.Lock()  # the role itself changes on the loop or on the deadline's thread
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []  # the deadline's and the renewal's

    @property
    def leading(self) -> bool:
        return self.role is ControllerRole.LEADING

    @property
    def epoch(self) -> int:
        return self.lease.epoch if self.lease is not None and self.leading else 0

    def leader_address(self) -> str:
        """Where the leader answers, as far as this controller knows ('' when none leads)."""
        if self.leading:
            return self.address
        seen = self.seen
        return seen.address if seen is not None and seen.live(self.clock.now()) else ""

    async def start(self) -> None:
        """Take the lease or stand by (whichever the database says), then keep at it in the background. A SQLite
        store's controller takes it at once and keeps it for its life (no other process can open the file)."""
        self.holder = f"{self.address}#{secrets.token_hex(4)}"
        if not self.store.shared:
            taken, _ = leases.take(self.store.engine, self.holder, self.address, self.timing.seconds, force=True)
            assert taken is not None  # forced
            self.lease = self.seen = self.store.fencing = taken
            await self._change(ControllerRole.LEADING, RoleCause.LEASE_TAKEN)
            return
        await self._try_take()
        if self.role is ControllerRole.STARTING:
            await self._change(ControllerRole.STANDBY, RoleCause.LEASE_HELD_ELSEWHERE)
        self._task = asyncio.ensure_future(self._run())
        loop = asyncio.get_running_loop()
        for name, work in (("lease-deadline", self._watch), ("lease-renewal", self._renew_forever)):
            thread = threading.Thread(target=work, args=(loop,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    async def _run(self) -> None:
        """A standby's looks at the lease (on the loop: taking it changes what the loop serves)."""
        while True:
            if not self.leading:
                await self._try_take()
            await asyncio.sleep(self.timing.poll_seconds)

    def _renew_forever(self, loop: asyncio.AbstractEventLoop) -> None:
        """The renewal's thread: a decision that holds the event loop for seconds must not cost the lease."""
        while not self._stopped.is_set():
            if self.leading:
                self._renew(loop)
            self._stopped.wait(self.timing.renew_seconds if self.leading else self.timing.poll_seconds)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """The deadline's thread: a leader whose renewal is overdue stops leading now (``leading`` is False from
        here on, whatever the event loop is doing); the role change's hook runs on the loop once it is free."""
        while not self._stopped.is_set():
            wait = self._deadline - self.clock.now() if self.leading else self.timing.poll_seconds
            if wait > 0:
                self._stopped.wait(min(wait, self.timing.poll_seconds))
                continue
            log.error("the lease's renewal is overdue (the database is unreachable?); stepping down")
            self._step_down_from_thread(loop, RoleCause.RENEWAL_OVERDUE)

    def _spawn_hook(self, change: RoleChange) -> None:
        task = asyncio.ensure_future(self._hook(change))
        task.add_done_callback(_log_failure)

    async def _try_take(self) -> None:
        force = not self.store.shared
        try:
            asked = self.clock.now()
            taken, seen = await asyncio.to_thread(
                leases.take, self.store.engine, self.holder, self.address, self.timing.seconds, force
            )
        except Exception as exc:  # the database is down: stay as we are, look again at the next poll
            log.warning("could not read the leader lease: %s", exc)
            return
        before, self.seen = self.seen, seen
        if taken is not None and not self.leading:
            self.previous = before.address if before is not None and before.holder != self.holder else ""
            with self._role_lock:
                self.lease = self.store.fencing = taken
                self._deadline = step_down_at(asked, self.timing.seconds, self.timing.margin_seconds)
            await self._change(ControllerRole.LEADING, RoleCause.LEASE_TAKEN)

    def _renew(self, loop: asyncio.AbstractEventLoop) -> None:
        """One renewal (on the renewal's thread; a hanging one is the deadline's business)."""
        mine = self.lease
        if mine is None:
            return
        asked = self.clock.now()
        try:
            renewed = leases.renew(self.store.engine, mine, self.timing.seconds)
        except Exception as exc:  # unreachable or slow: the deadline decides
            log.warning("renewing the leader lease failed: %s", exc)
            return
        if renewed is None:
            log.error("the lease was taken over (epoch %d is no longer ours); stepping down", mine.epoch)
            self._step_down_from_thread(loop, RoleCause.DEPOSED)
            return
        with self._role_lock:
            if self.lease is mine:  # not retaken meanwhile
                self.lease = self.seen = self.store.fencing = renewed
                self._deadline = step_down_at(asked, self.timing.seconds, self.timing.margin_seconds)

    def _step_down_from_thread(self, loop: asyncio.AbstractEventLoop, cause: RoleCause) -> None:
        change = self._record(ControllerRole.STANDBY, cause)
        if change is not None:
            loop.call_soon_threadsafe(self._spawn_hook, change)

    async def step_down(self, cause: RoleCause) -> None:
        """Stop leading now (a write found another epoch, or the renewal is overdue). Writes stay fenced by the
        old lease, so anything still under way is refused by the database."""
        if self.leading:
            await self._change(ControllerRole.STANDBY, cause)

    def _record(self, target: ControllerRole, cause: RoleCause) -> RoleChange | None:
        """Change the role (validated by the role table) and log it; None when it is ``target`` already."""
        with self._role_lock:
            if self.role is target:
                return None
            epoch = self.lease.epoch if self.lease is not None else 0
            change = change_role(self.role, target, cause, self.clock.now(), epoch)
            self.role = target
        log.warning("controller %s: %s -> %s (%s, epoch %d)", self.address, change.source, target, cause, epoch)
        return change

    async def _change(self, target: ControllerRole, cause: RoleCause) -> None:
        change = self._record(target, cause)
        if change is not None:
            await self._hook(change)

    async def _hook(self, change: RoleChange) -> None:
        async with self._changing:
            await self.on_change(change)

    async def stop(self) -> None:
        """Stop the background work; a leader releases its lease so a standby takes over at once."""
        self._stopped.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for thread in self._threads:
            await asyncio.to_thread(thread.join, 5.0)
        mine, was_leading = self.lease, self.leading
        if self.role is not ControllerRole.STOPPED:
            await self._change(ControllerRole.STOPPED, RoleCause.STOPPED)
        if was_leading and mine is not None and self.store.shared:
            with contextlib.suppress(Exception):  # unreachable: the lease runs out on its own
                await asyncio.to_thread(leases.release, self.store.engine, mine)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("a change of the controller's role failed to apply", exc_info=task.exception())
