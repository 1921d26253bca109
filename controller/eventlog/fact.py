"""A fact: one event's data as a frozen dataclass, written to the log as JSON and read back by its field types.

The writers (the controller's decisions, its store, its providers) build facts; the readers (the client's
timeline, the dashboard, the demo, the local harness and its tests) decode the same classes, so a field renamed
on one side breaks a test, not a picture. :func:`decode_fact` refuses data a fact cannot hold, naming the kind
and the field; a field the data lacks takes its default (what rows written before the field existed meant),
and a key the fact does not know is ignored (a newer controller's field, read by an older client).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin, get_type_hints

from controller.eventlog.kinds import EventKind

F = TypeVar("F", bound="Fact")


class EventDataError(ValueError):
    """An event's data is not what its kind's fact holds (a field missing or of another type), or its kind is
    none this version knows."""


@dataclass(frozen=True)
class RecordEvent:
    """A past-tense fact for the event log (``NodeRegistered``, ``EvictionNoticed``, ...): the command a
    decision returns and the store writes, ``data`` being its fact's :meth:`Fact.data`."""

    kind: EventKind
    at: float
    job: str | None = None
    node: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Fact:
    """What one event says. ``optional`` fields are left out of the data while None; ``renamed`` maps a field
    to its key in the data where the two differ (``from`` is a Python keyword)."""

    kind: ClassVar[EventKind]
    optional: ClassVar[frozenset[str]] = frozenset()
    renamed: ClassVar[tuple[tuple[str, str], ...]] = ()

    def data(self) -> dict[str, Any]:
        """The event's data as the log keeps it (JSON values)."""
        out: dict[str, Any] = encode(self)
        return out

    def recorded(self, at: float, job: str | None = None, node: str | None = None) -> RecordEvent:
        """The command that writes this fact to the event log, at ``at``, of ``job`` and ``node``."""
        return RecordEvent(self.kind, at, job, node, self.data())


def encode(value: Any) -> Any:
    """``value`` as JSON values: a dataclass as an object of its fields under their keys, optional Nones left out."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        keys = dict(getattr(value, "renamed", ()))
        optional: frozenset[str] = getattr(value, "optional", frozenset())
        fields = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
        return {keys.get(name, name): encode(v) for name, v in fields if not (v is None and name in optional)}
    if isinstance(value, list | tuple):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    return value


def decode_fact(cls: type[F], data: Any) -> F:
    """The fact of class ``cls`` the event data ``data`` holds; :class:`EventDataError` names what is wrong."""
    found: F = _record(cls, data, f"{cls.kind} event")
    return found


def _record(cls: Any, data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise EventDataError(f"{where}: expected an object, got {_shown(data)}")
    keys, hints = dict(getattr(cls, "renamed", ())), _hints(cls)
    optional: frozenset[str] = getattr(cls, "optional", frozenset())
    values = {}
    for f in dataclasses.fields(cls):
        key = keys.get(f.name, f.name)
        if key in data:
            values[f.name] = _value(hints[f.name], data[key], f"{where}, field {key}")
        elif f.name in optional:  # left out while None
            values[f.name] = None
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise EventDataError(f"{where}: no field {key} (what a {cls.__name__} always says)")
    return cls(**values)


def _value(hint: Any, value: Any, where: str) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        [inner] = [a for a in args if a is not type(None)]
        return _value(inner, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise EventDataError(f"{where}: expected a list, got {_shown(value)}")
        return [_value(args[0], item, f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise EventDataError(f"{where}: expected an object, got {_shown(value)}")
        return {k: _value(args[1], v, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        return _record(hint, value, where)
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint in (int, str, bool) and type(value) is hint:
        return value
    raise EventDataError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {_shown(value)}")


def _shown(value: Any) -> str:
    """A value in an error: its type, and a short repr (data may be long, or a node's words)."""
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)
