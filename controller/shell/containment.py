"""A decision that fails is contained: the observations or the request that caused it are refused, or its job fails.

Observations that arrived since the last decision are set aside and readmitted half by half, and the ones a
decision still fails with are refused, so one node's report never stops decisions for the others. A failure
no report or job explains (the database is down) stops decisions until one succeeds, and health says so.
A write refused because another controller leads is no failure to contain: this one steps down.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence

from controller.core import invariants
from controller.core.lifecycle import JOB_LIVE
from controller.core.model import Command, JobRecord, NodeObservation, World
from controller.core.reconcile import fail
from controller.core.stimulus import Stimulus
from controller.eventlog import facts
from controller.persistence.store import Deposed, unavailable
from controller.providers.base import Clock
from controller.shell.failures import DecisionsFailed, HealthPort, NotLeader, Refused, describe

log = logging.getLogger("spotmorph.controller")


class Containment:
    """The runner's failure handling (a mixin: :class:`controller.shell.runner.Runner` holds the state)."""

    clock: Clock
    jobs: dict[str, JobRecord]
    observed: dict[str, NodeObservation]
    health: HealthPort | None
    deciding: bool
    deposed: Callable[[], None]
    _fresh: set[str]
    _accepted: dict[str, NodeObservation]
    _refused: dict[str, tuple[NodeObservation, str]]

    @property
    def world(self) -> World:
        raise NotImplementedError

    def commit(self, commands: list[Command], stimulus: Stimulus) -> None:
        raise NotImplementedError

    def _decide(self, stimulus: Stimulus, first: Sequence[Command]) -> None:
        raise NotImplementedError

    def _contain(self, stimulus: Stimulus, first: Sequence[Command], failure: Exception) -> None:
        """Decide without what caused ``failure``: refuse the observations or the request it came from,
        or fail the job it came from.

        Raises :class:`Refused` when the request (``first``) was the cause, :class:`DecisionsFailed`
        when no decision can be made at all (then health says so until one can).
        """
        if isinstance(failure, Deposed):  # not a failure to contain: another controller decides now
            log.error("%s; stepping down", failure)
            self.deposed()
            raise NotLeader(str(failure)) from failure
        if unavailable(failure):
            self._deciding(False, failure)
            why = f"the state database cannot be written ({describe(failure)}); retry later"
            raise DecisionsFailed(why) from failure
        if self.deciding:  # while decisions keep failing, every tick would log the same traceback
            log.error("deciding failed (%s); looking for its cause", describe(failure), exc_info=failure)
            self._record(failure, stimulus)
        held = {name: self.observed[name] for name in sorted(self._fresh) if name in self.observed}
        if held:
            self._set_aside(held)
            if self._attempt(stimulus, first):
                self._refuse({name: held[name] for name in self._readmit(stimulus, held)}, failure, stimulus)
                return
            self.observed.update(held)  # not (only) theirs: kept for the next decision
        if first and self._attempt(stimulus, ()):
            raise Refused(f"deciding on this request failed ({describe(failure)}); nothing of it was kept")
        if not first and self._fail_culprit(failure, stimulus):
            return
        self._deciding(False, failure)
        raise DecisionsFailed(f"the controller cannot decide now ({describe(failure)}); retry later") from failure

    def _record(self, failure: Exception, stimulus: Stimulus) -> None:
        """A broken invariant is a bug: an event says so (the e2e tests fail on one), beside the log."""
        if isinstance(failure, invariants.InvariantViolated):
            with contextlib.suppress(Exception):  # the refusal stands; only its record may be missing
                broken = facts.InvariantViolated(sorted({str(v.invariant) for v in failure.found}), str(failure))
                self.commit([broken.recorded(self.clock.now())], stimulus)

    def _attempt(self, stimulus: Stimulus, first: Sequence[Command]) -> bool:
        try:
            self._decide(stimulus, first)
        except Exception as exc:
            log.debug("deciding still fails: %s", describe(exc))
            return False
        return True

    def _fail_culprit(self, failure: Exception, stimulus: Stimulus) -> bool:
        """Fail the first active job without which a decision succeeds (its own input breaks decisions)."""
        reason = f"the controller failed deciding on this job ({describe(failure)})"
        for job_id in sorted(j.id for j in self.jobs.values() if j.state in JOB_LIVE):
            if self._attempt(stimulus, fail(self.world, job_id, self.clock.now(), reason)):
                log.error("job %s failed: %s", job_id, reason)
                return True
        return False

    def _set_aside(self, held: dict[str, NodeObservation]) -> None:
        """Back to what the last decision saw of these nodes (nothing, for a node never decided on)."""
        for name in held:
            if name in self._accepted:
                self.observed[name] = self._accepted[name]
            else:
                self.observed.pop(name, None)

    def _readmit(self, stimulus: Stimulus, held: dict[str, NodeObservation]) -> list[str]:
        """``held`` fails as a whole: readmit each half; a single observation that still fails is refused."""
        if len(held) == 1:
            return list(held)
        names = sorted(held)
        refused: list[str] = []
        for part in (names[: len(names) // 2], names[len(names) // 2 :]):
            group = {name: held[name] for name in part}
            self.observed.update(group)
            self._fresh.update(group)
            if not self._attempt(stimulus, ()):
                self._set_aside(group)
                refused += self._readmit(stimulus, group)
        return refused

    def _refuse(self, refused: dict[str, NodeObservation], failure: Exception, stimulus: Stimulus) -> None:
        """Tell the callers still waiting on these observations, and log the refusal."""
        why = f"deciding on this report failed ({describe(failure)}); it was set aside"
        for name, seen in refused.items():
            log.warning("node %s: report refused: %s", name, why)
            self._refused[name] = (seen, why)
        now = self.clock.now()
        try:
            refusal = facts.ReportRefused(why)
            self.commit([refusal.recorded(now, node=name) for name in refused], stimulus)
        except Exception as exc:  # the refusal stands; only its record is missing
            log.warning("recording refused reports failed: %s", describe(exc))

    def _deciding(self, ok: bool, failure: Exception | None = None) -> None:
        """Tell health when decisions start failing (logged once, with the error) and when they work again."""
        if ok == self.deciding:
            return
        self.deciding = ok
        if ok:
            log.warning("decisions work again; health says SERVING")
        else:
            log.error("decisions fail; health says NOT_SERVING until one succeeds", exc_info=failure)
        if self.health is not None:
            self.health(ok)
