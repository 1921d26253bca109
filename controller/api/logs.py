"""Trainer logs at the edge: what ReportLogs and WatchLogs bring, checked before the log book sees it.

A ReportLogs carries at most :data:`~controller.core.logs.MAX_REQUEST_BYTES` of text in at most
:data:`~controller.core.logs.MAX_CHUNKS` chunks (more is RESOURCE_EXHAUSTED), each rank once. A chunk names
a job this controller has (else NOT_FOUND) and a generation it issued (else FAILED_PRECONDITION); that the
node ran the rank in that generation is checked against the generation's assignments when it is stored
(PERMISSION_DENIED). Every refusal names the field, ``chunks[i].<field>``, so an agent can tell which of its
files the controller will not take.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.api.reports import issued, known_job
from controller.core.intake import Full
from controller.core.logs import MAX_CHUNKS, MAX_RANK, MAX_REQUEST_BYTES, LogChunk, LogLine
from controller.shell.views import StateView
from morphing.validation import MAX_JOB_ID, STORABLE_INT, InvalidField, check_count, check_name, shown
from protos.spotmorph.v1 import controller_pb2 as pb

MAX_OFFSET = STORABLE_INT - MAX_REQUEST_BYTES  # a chunk's end must still be a number SQLite stores


def chunks(view: StateView, request: pb.ReportLogsRequest) -> tuple[LogChunk, ...]:
    """The request's chunks, every field checked (the ranks are checked as they are stored)."""
    if len(request.chunks) > MAX_CHUNKS:
        raise Full(f"chunks: {len(request.chunks)} chunks at once; send at most {MAX_CHUNKS} per call")
    size = sum(len(c.text) for c in request.chunks)
    if size > MAX_REQUEST_BYTES:
        raise Full(f"chunks: {size} bytes of text at once; send at most {MAX_REQUEST_BYTES} (256 KiB) per call")
    taken: list[LogChunk] = []
    seen: set[tuple[str, int, int]] = set()
    for i, c in enumerate(request.chunks):
        field = f"chunks[{i}]"
        job = known_job(view, f"{field}.job", c.job)
        if c.generation < 1:
            raise InvalidField(f"{field}.generation", "generations start at 1")
        issued(job, f"{field}.generation", c.generation)
        check_count(f"{field}.rank", c.rank, MAX_RANK)
        check_count(f"{field}.offset", c.offset, MAX_OFFSET)
        chunk = LogChunk(c.job, c.generation, c.rank, c.offset, c.text, c.eof)
        if chunk.key in seen:
            raise InvalidField(
                f"{field}.rank", f"job {c.job} generation {c.generation} rank {c.rank} is sent twice; send it once"
            )
        seen.add(chunk.key)
        taken.append(chunk)
    return tuple(taken)


def offsets_to_pb(taken: tuple[LogChunk, ...], offsets: list[int]) -> pb.ReportLogsResponse:
    return pb.ReportLogsResponse(
        offsets=[
            pb.LogOffset(job=c.job, generation=c.generation, rank=c.rank, offset=offset)
            for c, offset in zip(taken, offsets, strict=True)
        ]
    )


@dataclass(frozen=True)
class LogQuery:
    """What a WatchLogs asks for, checked."""

    job: str
    after: int
    rank: int | None
    generation: int | None


def query(view: StateView, request: pb.WatchLogsRequest) -> LogQuery:
    """A known job (NOT_FOUND), a cursor, and a rank and generation that can have lines (INVALID_ARGUMENT);
    a generation not issued yet only when the watch follows (it waits for it)."""
    if not request.job:
        raise InvalidField("job", "name the job whose logs to show, e.g. job-1")
    check_name("job", request.job, MAX_JOB_ID)
    job = view.job(request.job)
    if job is None:
        raise LookupError(f"job {shown(request.job)} not found")
    after = check_count("after", request.after)
    rank = check_count("rank", request.rank, MAX_RANK) if request.HasField("rank") else None
    generation = check_count("generation", request.generation) if request.HasField("generation") else None
    if generation is not None:
        if generation < 1:
            raise InvalidField("generation", "generations start at 1")
        if generation > job.generation and not request.follow:
            issued = f"generations 1..{job.generation}" if job.generation else "no generation yet"
            raise InvalidField("generation", f"{generation}: job {job.id} has {issued}")
    return LogQuery(job.id, after, rank, generation)


def line_to_pb(line: LogLine) -> pb.LogLine:
    return pb.LogLine(
        id=line.id, generation=line.generation, rank=line.rank, node=line.node, at=line.at, text=line.text
    )
