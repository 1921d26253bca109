"""Reading the event log back: every kind's fact, and the events of a log decoded into them.

The daemon's dashboard reads rows of its store, the client and the local harness read what ``spotmorph
events --json`` and the API give (``{"seq", "at", "kind", "job", "node", "data", "decision"}``); both decode
the data into the fact its writer built, so a reader says ``issued.fact.resume_step``, never
``data.get("resume_step")``.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Generic, TypeVar

from controller.eventlog import facts, provider_facts, scheduler_facts
from controller.eventlog.fact import EventDataError, Fact, decode_fact
from controller.eventlog.kinds import EventKind

F = TypeVar("F", bound=Fact)


@cache
def fact_classes() -> Mapping[EventKind, type[Fact]]:
    """Each kind's fact class: the classes of :mod:`.facts`, :mod:`.provider_facts` and
    :mod:`.scheduler_facts` that name a kind."""
    found = {
        cls.kind: cls
        for module in (facts, provider_facts, scheduler_facts)
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, Fact) and "kind" in vars(cls)
    }
    return types.MappingProxyType(found)


def decode(kind: str, data: Any) -> Fact:
    """The fact an event of ``kind`` with ``data`` says; :class:`EventDataError` names the kind and the field
    when the data is not what the fact holds, or the kind is none this version knows."""
    try:
        known = EventKind(kind)
    except ValueError:
        raise EventDataError(f"{kind!r}: no kind of event this version of spotmorph knows") from None
    return decode_fact(fact_classes()[known], data)


@dataclass(frozen=True)
class Logged(Generic[F]):
    """One event of the log, its data decoded: when, of which job and node, and what it says."""

    at: float
    job: str | None
    node: str | None
    fact: F
    seq: int = 0  # 0: the reader was not told
    decision: int | None = None

    def as_json(self) -> dict[str, Any]:
        """The event as ``spotmorph events --json`` prints it (what :func:`logged` reads)."""
        envelope = {"seq": self.seq, "at": self.at, "kind": str(self.fact.kind), "job": self.job, "node": self.node}
        return {**envelope, "data": self.fact.data(), "decision": self.decision}


def logged(events: Iterable[Mapping[str, Any]], cls: type[F]) -> list[Logged[F]]:
    """The events of ``cls``'s kind among ``events`` (as ``spotmorph events --json`` prints them), decoded."""
    return [_logged(event, cls) for event in events if event.get("kind") == cls.kind]


def _logged(event: Mapping[str, Any], cls: type[F]) -> Logged[F]:
    fact = decode_fact(cls, event.get("data"))
    job, node, decision = event.get("job"), event.get("node"), event.get("decision")
    return Logged(
        float(event["at"]),
        str(job) if job else None,
        str(node) if node else None,
        fact,
        int(event.get("seq") or 0),
        int(decision) if decision else None,
    )


__all__ = ["EventDataError", "Logged", "decode", "fact_classes", "logged"]
