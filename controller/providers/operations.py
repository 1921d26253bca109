"""The shell every cloud provider shares around its own calls: background operations, backoff, what it says.

A cloud provider (:mod:`.azure`, :mod:`.aws`, :mod:`.gcp`) lists its group on each poll and starts what its
planner says as background operations, one of a kind at a time (:class:`Operations`: ``pending`` by key,
``scale``, ``clean``, ``release:NAME``). An operation's outcome moves the group's backoff
(:mod:`controller.providers.scaling`) and becomes one event, never an exception out of a timer; the same failure
on every poll is said once. Each running instance is handed its agent token on its own clock
(:class:`TokenHandOvers`). A provider over a synchronous client runs its calls on threads of its own, each
under a deadline and retried while transient (:class:`Threads`). What is left in a provider's module is its
cloud's calls.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from typing import Any, TypeVar

from controller.core.events import EventKind
from controller.eventlog import provider_facts as facts
from controller.providers import scaling
from controller.providers.base import CannotList, Clock, ProviderPort
from controller.providers.scaling import Backoff, Failure, R

T = TypeVar("T")
K = EventKind
INFO_EVENTS = frozenset(
    {K.PROVIDER_SCALE_OUT, K.PROVIDER_SCALE_OUT_DONE, K.PROVIDER_DELETE_INSTANCES, K.PROVIDER_AGENT_TOKEN_DELIVERED}
)
BUSY_REFUSAL = "the node runs a job; operator override needed"


class ProviderUnavailable(CannotList):
    """No instance list this time (the cloud unreachable, throttled, the group missing): the runner skips the poll."""


class FailureMemory(Enum):
    """How long a failure stays said, so that the same failure on every poll is one event, not one a poll."""

    UNTIL_AN_OPERATION_SUCCEEDS = "until an operation succeeds"  # any background operation (a list does not count)
    UNTIL_IT_SUCCEEDS = "until it succeeds"  # the same operation ("list" included); another's success is no news


class Operations:
    """One group's background operations, its backoff and its events (reported through the provider port)."""

    def __init__(
        self,
        group: str,
        clock: Clock,
        port: ProviderPort,
        describe: Callable[[BaseException], Failure],
        backoff: tuple[float, float],
        log: logging.Logger,
        memory: FailureMemory = FailureMemory.UNTIL_AN_OPERATION_SUCCEEDS,
    ) -> None:
        """``group``: its name in every event; ``backoff``: the capacity backoff's base and cap, in seconds."""
        self.group = group
        self.clock = clock
        self.port = port
        self.describe = describe
        self.base, self.cap = backoff
        self.log = log
        self.memory = memory
        self.backoff = Backoff()
        self.pending: dict[str, asyncio.Task[None]] = {}
        self._failing: dict[tuple[str, str], str] = {}  # (operation or "", failure kind) -> its message

    def check_readable(self) -> None:
        """Raise :class:`ProviderUnavailable` while throttled: not even a read before then."""
        if not self.backoff.may_read(self.clock.now()):
            raise ProviderUnavailable(f"throttled until {self.backoff.throttled_until:.0f}")

    async def read(self, listing: Awaitable[T], unavailable: Callable[[BaseException], str] = str) -> T:
        """The group's list, or :class:`ProviderUnavailable` with the failure said (``unavailable``: its words)."""
        try:
            listed = await listing
        except Exception as exc:  # every cloud error is an event, never an exception out of a timer
            self.failed("list", exc)
            raise ProviderUnavailable(unavailable(exc)) from None
        if self.memory is FailureMemory.UNTIL_IT_SUCCEEDS:
            self.succeeded("list")
        return listed

    async def run(self, key: str, work: Coroutine[Any, Any, None], counts: bool = True) -> None:
        """Start ``work`` in the background; its outcome resets or extends the backoff (``counts``)."""
        what = key.split(":")[0]

        async def guarded() -> None:
            try:
                await work
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failed(what, exc)
            else:
                self.succeeded(what)
                if counts:
                    self.backoff = scaling.after_success(self.backoff)
            finally:
                self.pending.pop(key, None)

        self.pending[key] = asyncio.ensure_future(guarded())
        await asyncio.sleep(0)  # let it send its first request now

    def failed(self, what: str, exc: BaseException) -> None:
        failure = self.describe(exc)
        now = self.clock.now()
        self.backoff = scaling.after_failure(self.backoff, failure, now, self.base, self.cap)
        key = (what if self.memory is FailureMemory.UNTIL_IT_SUCCEEDS else "", str(failure.kind))
        if self._failing.get(key) == failure.message:
            self.log.warning("%s (again): %s", failure.kind, failure.message)
            return  # the same failure on every poll is one event, not one a poll
        self._failing[key] = failure.message
        fact = facts.CALL_FAILURES[failure.kind]
        self.event(fact(self.group, failure.message, what, self.backoff.retry_at(now)))

    def succeeded(self, what: str) -> None:
        """``what`` went through: which failures are news again depends on the memory."""
        if self.memory is FailureMemory.UNTIL_AN_OPERATION_SUCCEEDS:
            self._failing.clear()
        else:
            self._failing = {key: message for key, message in self._failing.items() if key[0] != what}

    def may_release(self, name: str, *, delete_busy: bool, force: bool) -> bool:
        """Whether ``name``'s instance may go (:func:`scaling.may_delete`); a refusal is said."""
        if scaling.may_delete(self.port.busy(name), delete_busy=delete_busy, force=force):
            return True
        self.event(facts.ProviderReleaseRefused(self.group, BUSY_REFUSAL, name))
        return False

    def event(self, fact: facts.ScaleSetFact) -> None:
        self.log.log(logging.INFO if fact.kind in INFO_EVENTS else logging.WARN, "%s: %s", fact.kind, fact.message)
        self.port.report(fact)

    def status(self) -> dict[str, Any]:
        """What every provider's status says of its operations and backoff."""
        now, backoff = self.clock.now(), self.backoff
        return {
            "pending": sorted(self.pending),
            "backoff_until": backoff.not_before if now < backoff.not_before else None,
            "throttled_until": backoff.throttled_until if now < backoff.throttled_until else None,
        }

    async def close(self) -> None:
        """Cancel the operations under way and wait until they ended."""
        for task in list(self.pending.values()):
            task.cancel()
        await asyncio.gather(*self.pending.values(), return_exceptions=True)


class TokenHandOvers:
    """Which running instances have their agent token, and the hand-overs under way (in ``ops.pending``).

    A failed hand-over is that instance's alone: an event, and another try after ``retry_seconds``, while the
    group's backoff (capacity, throttling) is left as it is."""

    def __init__(self, ops: Operations, vm_token: Callable[[str], str], retry_seconds: float) -> None:
        self.ops = ops
        self.vm_token = vm_token  # the agent token of an instance, by name
        self.retry_seconds = retry_seconds
        self.delivered: set[str] = set()  # handed their token (again after a controller restart)
        self.retry_at: dict[str, float] = {}  # instance -> when its failed hand-over is tried again

    def needing(self, listed: Iterable[R], name: Callable[[R], str]) -> list[R]:
        """The running instances to hand their token now (:func:`scaling.needing_token`)."""
        now = self.ops.clock.now()
        return scaling.needing_token(listed, name, self.delivered, self.retry_at, self.ops.pending, now)

    def under_way(self) -> int:
        return sum(1 for key in self.ops.pending if key.startswith(f"{scaling.TOKEN_TASK}:"))

    def keep_only(self, names: set[str]) -> None:
        """Forget instances no longer listed (a name the cloud reuses is a new VM: it gets its token again)."""
        self.delivered &= names

    def start(
        self, name: str, hand_over: Callable[[str], Awaitable[None]], say: Callable[[BaseException], str]
    ) -> None:
        """Hand ``name`` its token in the background: ``hand_over(token)``; ``say``: a failure in words."""
        key = scaling.token_key(name)
        self.ops.pending[key] = asyncio.ensure_future(self._hand(key, name, hand_over, say))

    async def _hand(
        self, key: str, name: str, hand_over: Callable[[str], Awaitable[None]], say: Callable[[BaseException], str]
    ) -> None:
        ops = self.ops
        try:
            await hand_over(self.vm_token(name))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            retry_at = ops.clock.now() + self.retry_seconds
            self.retry_at[name] = retry_at
            ops.event(facts.ProviderAgentTokenFailed(ops.group, f"{name}: {say(exc)}", name, retry_at))
        else:
            self.delivered.add(name)
            self.retry_at.pop(name, None)
            ops.event(facts.ProviderAgentTokenDelivered(ops.group, name, name))
        finally:
            ops.pending.pop(key, None)


class Threads:
    """A synchronous client's calls on a small pool of the provider's own, so the event loop never waits on the
    cloud and ``close`` never waits for a call stuck until its timeout."""

    def __init__(self, workers: int, name: str, sleep: Callable[[float], Awaitable[None]], log: logging.Logger):
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix=name)
        self.sleep = sleep  # the waits between retries (tests record them)
        self.log = log

    def call(self, call: Callable[[], T]) -> asyncio.Future[T]:
        return asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(call))

    async def retried(
        self, call: Callable[[], T], deadline: float, retries: int, wait: Callable[[Exception, int], float | None]
    ) -> T:
        """``call`` in a thread within ``deadline`` seconds, tried again up to ``retries`` times after
        ``wait(exc, attempt)`` seconds while that says so (None: the failure is final)."""
        attempt = 0
        while True:
            try:
                async with asyncio.timeout(deadline):  # not wait_for: it may swallow a cancel
                    return await self.call(call)
            except Exception as exc:
                pause = wait(exc, attempt)
                if pause is None or attempt >= retries:
                    raise
                self.log.info("try %d of %d in %g s: %s", attempt + 2, retries + 1, pause, " ".join(str(exc).split()))
                await self.sleep(pause)
                attempt += 1

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)  # a call under way ends by its own timeout
