"""The lease row in the store, and the fence every write of the leader passes (controller.core.leadership).

Takes and renewals compare against the database's clock (:func:`.dialect.database_now`), so controllers on
different hosts agree on when a lease runs out. :func:`fence` runs first in every write transaction of the
leader: it reads the lease row under a shared lock (PostgreSQL ``FOR SHARE``), so a standby's takeover,
which updates that row, waits for the writes under way, and every write after it sees the new epoch and
is refused with :class:`Deposed`.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, select, text

from controller.core.leadership import LEASE, Lease, claim, renewed
from controller.persistence.dialect import database_now, insert, now_sql, upsert
from controller.persistence.schema import leases


class Deposed(RuntimeError):
    """Another controller holds the lease now: this one's write was refused, and it must step down."""


def read(conn: Connection, lock: bool = False) -> Lease | None:
    query = select(leases).where(leases.c.name == LEASE)
    row = conn.execute(query.with_for_update() if lock else query).first()
    return None if row is None else Lease(row.holder, row.address, int(row.epoch), float(row.expires_at))


def current(engine: Engine) -> Lease | None:
    with engine.connect() as conn:
        return read(conn)


def take(engine: Engine, holder: str, address: str, seconds: float, force: bool) -> tuple[Lease | None, Lease | None]:
    """(the lease ``holder`` now holds or None, the lease as it stands after: whose it is)."""
    with engine.begin() as conn:
        now = database_now(conn)
        found = read(conn, lock=True)
        if found is None:
            first = claim(None, holder, address, now, seconds, force)
            if first is not None and _insert_first(conn, first):
                return first, first
            found = read(conn, lock=True)  # another controller's first lease, committed while this one waited
        taken = claim(found, holder, address, now, seconds, force)
        if taken is not None:
            _write(conn, taken)
        return taken, taken or found


def renew(engine: Engine, mine: Lease, seconds: float) -> Lease | None:
    """``mine`` extended, or None when another holds it now. One statement, committed by the server on its own
    (autocommit): a leader paused or cut off mid-renewal never leaves the lease row locked from a standby."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        row = conn.execute(
            text(
                f"UPDATE leases SET expires_at = {now_sql(conn)} + :seconds "
                "WHERE name = :name AND holder = :holder AND epoch = :epoch RETURNING expires_at"
            ),
            {"seconds": seconds, "name": LEASE, "holder": mine.holder, "epoch": mine.epoch},
        ).first()
    return None if row is None else Lease(mine.holder, mine.address, mine.epoch, float(row[0]))


def release(engine: Engine, mine: Lease) -> None:
    """Expire ``mine`` now (a clean stop), so a standby takes over at its next look, not at expiry."""
    with engine.begin() as conn:
        if renewed(read(conn, lock=True), mine, 0.0, 0.0) is not None:
            _write(conn, Lease(mine.holder, mine.address, mine.epoch, 0.0))


def fence(conn: Connection, mine: Lease) -> None:
    """Inside a write transaction: refuse it (:class:`Deposed`) unless ``mine`` is still the lease's epoch."""
    row = conn.execute(
        select(leases.c.holder, leases.c.epoch).where(leases.c.name == LEASE).with_for_update(read=True)
    ).first()
    if row is None or row.holder != mine.holder or int(row.epoch) != mine.epoch:
        held = "no controller" if row is None else f"epoch {row.epoch}"
        raise Deposed(f"this controller's lease (epoch {mine.epoch}) was taken over ({held} holds it now)")


def _insert_first(conn: Connection, lease: Lease) -> bool:
    """The first lease row, unless another controller inserted one first (False): with no row yet, the lock
    :func:`read` takes locks nothing, and two controllers starting together would both take epoch 1."""
    return conn.execute(insert(conn, leases).values(**_values(lease)).on_conflict_do_nothing()).rowcount == 1


def _write(conn: Connection, lease: Lease) -> None:
    upsert(conn, leases, ["name"], _values(lease))


def _values(lease: Lease) -> dict[str, object]:
    return {
        "name": LEASE,
        "holder": lease.holder,
        "address": lease.address,
        "epoch": lease.epoch,
        "expires_at": lease.expires_at,
    }
