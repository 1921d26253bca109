"""Trainer logs as the controller keeps them: the pure rules, no I/O.

An agent ships each rank's log file (its trainer's stdout and stderr) in chunks: bytes at a byte offset.
The controller keeps, per (job, generation, rank), a *stream*: how many bytes of the file it has (its
offset) and the start of an unfinished last line. A chunk must continue exactly where the stream ends:
what it repeats is trimmed, and one that starts further on (a gap) is not taken, the answer being the
offset wanted. Complete lines are decoded as UTF-8 (anything else with replacement characters), a
line longer than :data:`MAX_LINE_BYTES` keeps its start and says how much was cut, and a job keeps its
newest :data:`MAX_JOB_LINES` lines and :data:`MAX_JOB_BYTES` bytes (older lines are deleted).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MAX_REQUEST_BYTES = 256 << 10  # the text of one ReportLogs; more at once is RESOURCE_EXHAUSTED
MAX_CHUNKS = 1024  # chunks in one ReportLogs
MAX_LINE_BYTES = 16 << 10  # a longer line keeps this much and says how much was cut
MAX_JOB_LINES = 10_000  # a job keeps its newest lines, at most this many ...
MAX_JOB_BYTES = 4 << 20  # ... and at most this many bytes of text
MAX_RANK = 1 << 20  # a rank a log may name (layouts are far smaller)


class NotRun(Exception):
    """A node sent the log of a rank it did not run (in that generation): not its to send."""


def cut_marker(cut: int) -> str:
    """What ends a line that was cut: how many bytes of it are not kept."""
    return f" [... line cut: {cut} more bytes]"


@dataclass(frozen=True)
class LogChunk:
    """Bytes of one rank's log file at ``offset``; ``eof``: its trainer exited and the file ends here."""

    job: str
    generation: int
    rank: int
    offset: int
    data: bytes
    eof: bool = False

    @property
    def key(self) -> tuple[str, int, int]:
        return self.job, self.generation, self.rank


@dataclass(frozen=True)
class LogStream:
    """What the controller holds of one rank's log: ``offset`` bytes, of which ``pending`` (at most
    :data:`MAX_LINE_BYTES`) begin a line not finished yet, and ``cut`` more bytes of that line were dropped."""

    offset: int = 0
    pending: bytes = b""
    cut: int = 0


@dataclass(frozen=True)
class LogLine:
    """One stored line: ``id`` is the cursor (grows with every line kept, never reused)."""

    id: int
    job: str
    generation: int
    rank: int
    node: str
    at: float  # unix seconds the controller received it
    text: str


@dataclass(frozen=True)
class Taken:
    """A chunk taken into its stream: the stream after it and the lines it completed (oldest first)."""

    stream: LogStream
    lines: tuple[str, ...]


def take(stream: LogStream, chunk: LogChunk) -> Taken:
    """``chunk`` continuing ``stream``: what the stream has already is trimmed; a chunk that starts past
    the stream's end (a gap) takes nothing, and the stream's offset is the one to send from."""
    if chunk.offset > stream.offset:
        return Taken(stream, ())
    end = chunk.offset + len(chunk.data)
    new = chunk.data[stream.offset - chunk.offset :]
    lines: list[str] = []
    pending, cut, start = stream.pending, stream.cut, 0
    while (newline := new.find(b"\n", start)) >= 0:
        lines.append(line_text(pending, cut, new[start:newline]))
        pending, cut, start = b"", 0, newline + 1
    rest = new[start:]
    room = MAX_LINE_BYTES - len(pending)
    pending, cut = pending + rest[:room], cut + max(0, len(rest) - room)
    if chunk.eof and end >= stream.offset and (pending or cut):  # the file ends without a newline
        lines.append(line_text(pending, cut, b""))
        pending, cut = b"", 0
    return Taken(LogStream(max(stream.offset, end), pending, cut), tuple(lines))


def line_text(pending: bytes, cut: int, tail: bytes) -> str:
    """One complete line (its newline removed) as text: ``pending`` and ``cut`` as a stream holds them,
    then ``tail``. A Windows line end is dropped; a line over :data:`MAX_LINE_BYTES` keeps its start, cut
    at a character boundary, and ends with :func:`cut_marker`."""
    whole = len(pending) + cut + len(tail)
    head = (pending + tail)[:MAX_LINE_BYTES]
    if len(head) == whole:
        return head.removesuffix(b"\r").decode("utf-8", "replace")
    head = head[: _boundary(head)]
    return head.decode("utf-8", "replace") + cut_marker(whole - len(head))


def _boundary(data: bytes) -> int:
    """Where ``data`` may be cut without splitting a UTF-8 character (at most 3 bytes back)."""
    end = len(data)
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte & 0xC0 != 0x80:  # not a continuation byte: a character starts here
            width = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return end if back >= width else end - back
    return end


def text_bytes(text: str) -> int:
    """How much a stored line counts against its job's :data:`MAX_JOB_BYTES`."""
    return len(text.encode())


@dataclass(frozen=True)
class Kept:
    """A job's lines after pruning: the newest ``last_dropped`` id deleted (None: none), what remains."""

    last_dropped: int | None
    lines: int
    size: int


def prune(oldest_first: Iterable[tuple[int, int]], lines: int, size: int) -> Kept:
    """Which of a job's oldest lines (``(id, bytes)``, oldest first) to delete so that at most
    :data:`MAX_JOB_LINES` lines and :data:`MAX_JOB_BYTES` bytes remain of ``lines`` and ``size``."""
    dropped: int | None = None
    for line_id, line_size in oldest_first:
        if lines <= MAX_JOB_LINES and size <= MAX_JOB_BYTES:
            break
        dropped, lines, size = line_id, lines - 1, size - line_size
    return Kept(dropped, lines, size)


def over_bound(lines: int, size: int) -> bool:
    return lines > MAX_JOB_LINES or size > MAX_JOB_BYTES


def newest_that_fit(sizes: Sequence[int]) -> int:
    """How many of a request's new lines of one job (``sizes``, oldest first) to leave out so that the rest fit
    the job's bound on their own: lines :func:`prune` would delete at once are never inserted (a 256 KiB
    ReportLogs of empty lines is 262,144 lines, of which a job keeps 10,000)."""
    lines, size, start = 0, 0, len(sizes)
    while start > 0 and lines < MAX_JOB_LINES and size + sizes[start - 1] <= MAX_JOB_BYTES:
        start -= 1
        lines, size = lines + 1, size + sizes[start]
    return start
