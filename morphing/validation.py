"""Checks of values that arrive from outside (an RPC, a spec file): pure, each naming the field and the fix.

Strings that become a path, an address or a name are refused when they hold control characters, match
their rule only in part, or (paths) are relative or not normalised; numbers are refused outside the
range the controller can store (SQLite integers are signed 64-bit) or the job allows (a step past the
job's last one). Nothing here touches the file system: whether a file exists is the caller's question.
"""

from __future__ import annotations

import ipaddress
import math
import posixpath
import re
import unicodedata

from morphing.errors import UserInputError

STORABLE_INT = 2**63 - 1  # the largest integer SQLite stores
MAX_NAME_LENGTH = 63
MAX_PATH_LENGTH = 4096
MAX_HOSTNAME_LENGTH = 253
MAX_JOB_ID = 128  # a job id as agents and clients may name it back to the controller
LATEST_TIME = 1e11  # unix seconds in the year 5138: later is not a time a VM will be evicted at
MAX_STALL_SECONDS = 7 * 86400.0  # a checkpoint that paused training longer (a week) is a broken report
# A loss larger in magnitude is a broken report or a user's mis-scaled loss, not a diverged model (that is
# inf or NaN). The controller refuses it, the agent never sends it, the trainer fails the job with it.
MAX_LOSS = 1e30
MAX_SAMPLES_PER_SECOND = 1e12  # a faster step is a broken clock, not a fast cluster
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
# Unicode categories that never belong in a name, an address or a path: controls (NUL, newline, ESC,
# ...), surrogates, format characters (zero-width, bidi overrides) and line or paragraph separators.
UNPRINTABLE = frozenset({"Cc", "Cs", "Cf", "Zl", "Zp"})


class InvalidField(UserInputError):
    """A field's value is refused; ``str()`` names the field, the problem and the fix."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def shown(value: str, limit: int = 40) -> str:
    """``value`` as a message may quote it: its repr, cut short (a hostile value can be a megabyte)."""
    text = repr(value[: limit + 1])
    return text if len(value) <= limit else f"{text[:-1]}...{text[-1]}"


def unprintable(value: str) -> str | None:
    """The first character of ``value`` that is a control, format or separator character, if any."""
    return next((c for c in value if unicodedata.category(c) in UNPRINTABLE), None)


def check_text(field: str, value: str, max_length: int) -> str:
    """Printable text of at most ``max_length`` characters."""
    if len(value) > max_length:
        raise InvalidField(field, f"{len(value)} characters; use at most {max_length}")
    bad = unprintable(value)
    if bad is not None:
        raise InvalidField(field, f"{shown(value)} holds the control character {bad!r}; remove it")
    return value


def check_name(field: str, value: str, max_length: int = MAX_NAME_LENGTH) -> str:
    """A name in full: a letter or digit, then letters, digits, '.', '_' or '-'."""
    check_text(field, value, max_length)
    if not NAME.fullmatch(value):
        rule = "a letter or digit, then letters, digits, '.', '_' or '-'"
        raise InvalidField(field, f"{shown(value)}: use {rule} (at most {max_length})")
    return value


def check_address(field: str, value: str) -> str:
    """A host other machines can reach: an IPv4 or IPv6 address, or an RFC 1123 host name."""
    check_text(field, value, MAX_HOSTNAME_LENGTH)
    fix = "give an IP address or a host name (letters, digits and '-' in dot-separated labels)"
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        labels = value.split(".")
        if not all(HOST_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
            raise InvalidField(field, f"{shown(value)} is neither an IP address nor a host name; {fix}") from None
        return value
    if address.is_unspecified or address.is_multicast or getattr(address, "scope_id", None):
        raise InvalidField(field, f"{value} is not an address other nodes can reach; {fix}")
    return value


def check_absolute_path(field: str, value: str, max_length: int = MAX_PATH_LENGTH) -> str:
    """An absolute, normalised path: it means the same on every machine and in every working directory."""
    check_text(field, value, max_length)
    if not value.startswith("/"):
        raise InvalidField(field, f"{shown(value)} is relative; give an absolute path (the client resolves spec paths)")
    if posixpath.normpath(value) != value or value.startswith("//"):
        raise InvalidField(field, f"{shown(value)} is not normalised; give {shown(posixpath.normpath(value))}")
    return value


def entrypoint_file(entrypoint: str) -> str | None:
    """The file of a ``path/file.py:function`` entrypoint (``None`` for ``package.module:function``)."""
    target = entrypoint.rpartition(":")[0]
    return target if target.endswith(".py") or "/" in target else None


def check_entrypoint(field: str, value: str) -> str:
    """``/abs/path/file.py:function`` or ``package.module:function``."""
    check_text(field, value, MAX_PATH_LENGTH)
    target, sep, function = value.rpartition(":")
    if not sep or not function.isidentifier():
        raise InvalidField(field, f"{shown(value)}: use /path/file.py:function or package.module:function")
    file = entrypoint_file(value)
    if file is None:
        if not MODULE.fullmatch(target):
            raise InvalidField(field, f"{shown(target)} is not a module name; use package.module:function")
        return value
    check_absolute_path(field, file)
    if not file.endswith(".py"):
        raise InvalidField(field, f"{shown(file)} is not a Python file; name a .py file")
    return value


def check_count(field: str, value: int, maximum: int = STORABLE_INT) -> int:
    """An integer in ``0..maximum``."""
    if not 0 <= value <= maximum:
        raise InvalidField(field, f"{value} is out of range; use 0..{maximum}")
    return value


def check_step(field: str, value: int, steps: int) -> int:
    """A step of a job of ``steps`` steps: none comes after its last one."""
    if not 0 <= value <= steps:
        raise InvalidField(field, f"step {value} is beyond the job's last step {steps}")
    return value


def check_finite(field: str, value: float, max_magnitude: float) -> float:
    """A finite number no larger in magnitude than ``max_magnitude`` (a measurement: a loss, a duration)."""
    if not math.isfinite(value) or abs(value) > max_magnitude:
        raise InvalidField(field, f"{value!r} is not a finite number within +-{max_magnitude:g}")
    return value


def is_duration(seconds: float) -> bool:
    """A measured duration the controller accepts (the agent sends no other): 0 up to a week."""
    return math.isfinite(seconds) and 0 <= seconds <= MAX_STALL_SECONDS


def is_stall(seconds: float) -> bool:
    """A checkpoint's pause of training the controller accepts: a duration (:func:`is_duration`)."""
    return is_duration(seconds)


def is_loss(value: float) -> bool:
    """A loss the controller accepts (the agent sends no other): finite, within +-:data:`MAX_LOSS`."""
    return math.isfinite(value) and abs(value) <= MAX_LOSS


def is_rate(samples_per_second: float) -> bool:
    """A step's samples/s the controller accepts (the agent sends no other): 0 up to the bound above."""
    return math.isfinite(samples_per_second) and 0 <= samples_per_second <= MAX_SAMPLES_PER_SECOND


def is_time(value: float) -> bool:
    """Unix seconds the controller accepts (the agent sends no other): 0 up to :data:`LATEST_TIME`."""
    return math.isfinite(value) and 0 <= value <= LATEST_TIME


def check_time(field: str, value: float) -> float:
    """Unix seconds: finite, not negative, not beyond :data:`LATEST_TIME`."""
    if not is_time(value):
        raise InvalidField(field, f"{value!r} is not a time; give unix seconds (0..{LATEST_TIME:.0e})")
    return value


def printable(value: str, max_length: int) -> str:
    """Text for people (an error message, a log tail): control characters but newlines and tabs dropped, cut short."""
    kept = "".join(c for c in value[: max_length * 2] if c in "\n\t" or unicodedata.category(c) not in UNPRINTABLE)
    return kept[:max_length]
