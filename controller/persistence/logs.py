"""Trainer logs in the state database: streams, lines and each job's totals (tables in :mod:`.schema`).

One call appends one ReportLogs in one transaction: the node's ranks checked against the generation's
assignments, each chunk taken into its stream (:func:`controller.core.logs.take`), the lines it
completed inserted, then the job's oldest lines deleted down to its bound. The store calls these on a
thread of its caller's choosing (never the event loop); log writes are serialised by their caller.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from sqlalchemy import Connection, insert, select

from controller.core import logs
from controller.core.logs import LogChunk, LogLine, LogStream, NotRun
from controller.persistence.dialect import insert as upsert_into
from controller.persistence.dialect import json_value
from controller.persistence.schema import assignments, generations, log_jobs, log_lines, log_streams, nodes

PRUNE_BATCH = 1000  # oldest lines read at a time while pruning


def check_ranks(conn: Connection, node: str, chunks: Sequence[LogChunk]) -> None:
    """Every chunk is of a rank the generation placed on ``node`` (else :class:`NotRun`, naming the chunk), and
    of a generation issued since the VM that sends it took the name: a VM that took a LOST node's name ran
    none of the old node's ranks (the same VM's restarted agent did, and sends on)."""
    placed: dict[tuple[str, int], frozenset[int]] = {}
    issued: dict[tuple[str, int], float | None] = {}
    taken_at = _name_taken_at(conn, node)
    for i, chunk in enumerate(chunks):
        key = (chunk.job, chunk.generation)
        if key not in placed:
            where = (
                (assignments.c.job == chunk.job)
                & (assignments.c.generation == chunk.generation)
                & (assignments.c.node == node)
            )
            ranks = conn.execute(select(assignments.c.ranks).where(where)).scalar()
            placed[key] = frozenset(int(r) for r in ranks or ())
        if chunk.rank not in placed[key]:
            raise NotRun(
                f"chunks[{i}].rank: {node} ran no rank {chunk.rank} of job {chunk.job} generation "
                f"{chunk.generation}; a node sends only the logs of the ranks it ran"
            )
        if taken_at is not None and key not in issued:
            issued[key] = _issued_at(conn, chunk.job, chunk.generation)
        when = issued.get(key)
        if taken_at is not None and when is not None and when < taken_at:
            raise NotRun(
                f"chunks[{i}].generation: generation {chunk.generation} of job {chunk.job} was placed on {node} "
                "before this VM took the name; a node sends only the logs of the ranks it ran"
            )


def _name_taken_at(conn: Connection, node: str) -> float | None:
    raw = conn.execute(select(nodes.c.data).where(nodes.c.name == node)).scalar()
    data = json_value(raw) if raw is not None else {}
    data = data if isinstance(data, dict) else {}
    taken = data.get("name_taken_at")
    return float(taken) if isinstance(taken, (int, float)) else None


def _issued_at(conn: Connection, job: str, generation: int) -> float | None:
    where = (generations.c.job == job) & (generations.c.generation == generation)
    found = conn.execute(select(generations.c.issued_at).where(where)).scalar()
    return None if found is None else float(found)


def append(conn: Connection, node: str, chunks: Sequence[LogChunk], at: float) -> list[int]:
    """Take ``chunks`` (each rank once) from ``node`` received ``at``; the offset each stream is at after."""
    check_ranks(conn, node, chunks)
    offsets: list[int] = []
    rows: dict[str, list[tuple[dict[str, object], int]]] = {}  # the new lines (row, bytes) by job, oldest first
    for chunk in chunks:
        stream = _stream(conn, chunk)
        taken = logs.take(stream, chunk)
        offsets.append(taken.stream.offset)
        if taken.stream != stream:
            values = {"offset": taken.stream.offset, "pending": taken.stream.pending, "cut": taken.stream.cut}
            upsert = upsert_into(conn, log_streams).values(
                job=chunk.job, generation=chunk.generation, rank=chunk.rank, node=node, **values
            )
            conn.execute(upsert.on_conflict_do_update(index_elements=["job", "generation", "rank"], set_=values))
        line = {"job": chunk.job, "generation": chunk.generation, "rank": chunk.rank, "node": node, "at": at}
        sized = ((text, logs.text_bytes(text)) for text in taken.lines)
        rows.setdefault(chunk.job, []).extend(({**line, "text": t, "size": n}, n) for t, n in sized)
    for job, new in rows.items():
        kept = new[logs.newest_that_fit([n for _, n in new]) :]  # the others would be deleted at once
        if kept:
            conn.execute(insert(log_lines), [row for row, _ in kept])
            _bound(conn, job, len(kept), sum(n for _, n in kept))
    return offsets


def _stream(conn: Connection, chunk: LogChunk) -> LogStream:
    where = (
        (log_streams.c.job == chunk.job)
        & (log_streams.c.generation == chunk.generation)
        & (log_streams.c.rank == chunk.rank)
    )
    row = conn.execute(select(log_streams.c.offset, log_streams.c.pending, log_streams.c.cut).where(where)).first()
    return LogStream() if row is None else LogStream(int(row.offset), bytes(row.pending), int(row.cut))


def _bound(conn: Connection, job: str, lines: int, size: int) -> None:
    """Add to the job's totals; past its bound, delete its oldest lines (:func:`controller.core.logs.prune`)."""
    upsert = upsert_into(conn, log_jobs).values(job=job, lines=lines, size=size)
    set_ = {"lines": log_jobs.c.lines + upsert.excluded.lines, "size": log_jobs.c.size + upsert.excluded.size}
    conn.execute(upsert.on_conflict_do_update(index_elements=["job"], set_=set_))
    totals = conn.execute(select(log_jobs.c.lines, log_jobs.c.size).where(log_jobs.c.job == job)).one()
    if not logs.over_bound(int(totals.lines), int(totals.size)):
        return
    kept = logs.prune(_oldest(conn, job), int(totals.lines), int(totals.size))
    if kept.last_dropped is not None:
        conn.execute(log_lines.delete().where((log_lines.c.job == job) & (log_lines.c.id <= kept.last_dropped)))
    conn.execute(log_jobs.update().where(log_jobs.c.job == job).values(lines=kept.lines, size=kept.size))


def _oldest(conn: Connection, job: str) -> Iterator[tuple[int, int]]:
    """``(id, size)`` of the job's lines, oldest first, read a batch at a time."""
    after = 0
    while True:
        query = select(log_lines.c.id, log_lines.c.size).where((log_lines.c.job == job) & (log_lines.c.id > after))
        batch = [(int(i), int(s)) for i, s in conn.execute(query.order_by(log_lines.c.id).limit(PRUNE_BATCH))]
        yield from batch
        if len(batch) < PRUNE_BATCH:
            return
        after = batch[-1][0]


def read(conn: Connection, job: str, after: int, rank: int | None, generation: int | None, limit: int) -> list[LogLine]:
    """Up to ``limit`` of the job's lines with an id above ``after`` (of that rank, that generation), in order."""
    query = select(log_lines).where((log_lines.c.job == job) & (log_lines.c.id > after))
    if rank is not None:
        query = query.where(log_lines.c.rank == rank)
    if generation is not None:
        query = query.where(log_lines.c.generation == generation)
    rows = conn.execute(query.order_by(log_lines.c.id).limit(limit))
    return [LogLine(r.id, r.job, r.generation, r.rank, r.node, r.at, r.text) for r in rows]
