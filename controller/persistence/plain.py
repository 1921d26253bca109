"""Frozen dataclasses to JSON-ready values and back, driven by the dataclasses' own field types.

One codec for every record the store keeps as JSON: a field added to a record is stored without a line
here, and read back strictly (a row without it is refused): what an older row lacks is filled in by a
schema migration (:data:`controller.persistence.schema.MIGRATIONS`), the one place that knows history.
"""

from __future__ import annotations

import dataclasses
import types
from enum import Enum
from functools import cache
from typing import Any, Union, get_args, get_origin, get_type_hints

from pydantic import BaseModel

from morphing.layout import Layout


def to_plain(value: Any) -> Any:
    """``value`` as JSON values: enums by value, tuples as lists, dataclasses as objects of their fields."""
    if isinstance(value, Enum):
        return value.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Layout):
        return value.to_dict()
    if isinstance(value, BaseModel):
        return value.model_dump()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [to_plain(item) for item in value]
    raise TypeError(f"cannot store a {type(value).__name__}")


class RowError(ValueError):
    """A stored row does not hold the record its type says (a field missing, or of another type)."""


def from_plain(kind: Any, data: Any, where: str = "row") -> Any:
    """The value of type ``kind`` that :func:`to_plain` stored as ``data``; :class:`RowError` names the field."""
    origin, args = get_origin(kind), get_args(kind)
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        [inner] = [a for a in args if a is not type(None)]
        return from_plain(inner, data, where)
    if origin is tuple:
        if not isinstance(data, list):
            raise RowError(f"{where}: expected a list, got {type(data).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_plain(args[0], item, f"{where}[{i}]") for i, item in enumerate(data))
        if len(args) != len(data):
            raise RowError(f"{where}: expected {len(args)} items, got {len(data)}")
        return tuple(from_plain(a, item, f"{where}[{i}]") for i, (a, item) in enumerate(zip(args, data, strict=True)))
    if isinstance(kind, type) and issubclass(kind, Enum):
        return kind(data)
    if kind is Layout:
        return Layout.from_dict(data)
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return kind.model_validate(data)
    if dataclasses.is_dataclass(kind):
        return _record(kind, data, where)
    if kind is float and isinstance(data, int | float) and not isinstance(data, bool):
        return float(data)
    if kind in (int, str, bool) and type(data) is kind:
        return data
    raise RowError(f"{where}: expected {getattr(kind, '__name__', kind)}, got {type(data).__name__}")


def _record(kind: Any, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise RowError(f"{where}: expected an object, got {type(data).__name__}")
    hints = _hints(kind)
    missing = [f.name for f in dataclasses.fields(kind) if f.name not in data]
    if missing:
        raise RowError(f"{where}: no {', '.join(missing)} (a row older than the field needs a schema migration)")
    values = {f.name: from_plain(hints[f.name], data[f.name], f"{where}.{f.name}") for f in dataclasses.fields(kind)}
    return kind(**values)


@cache
def _hints(kind: type) -> dict[str, Any]:
    return get_type_hints(kind)
