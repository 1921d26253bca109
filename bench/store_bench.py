"""The controller on PostgreSQL against SQLite: heartbeat latency at 1,000 agents, and eviction convergence.

``bench/controller_bench.py``'s pieces (the controller process, the load generators, the eviction scenario)
run against a controller on SQLite (``--state-dir``) and one on PostgreSQL (``--database``), alternating
the two within one session (SQLite, PostgreSQL, SQLite, PostgreSQL, ...) so that the machine's drift and
noise show as the spread between rounds of one store. Every round starts a fresh controller (and a fresh
database); one PostgreSQL server serves the whole session and runs during the SQLite rounds too.

The PostgreSQL server is as durable as PostgreSQL's defaults (fsync, synchronous_commit, full_page_writes
on, autovacuum on, 128 MB of shared buffers), its data on the same file system as SQLite's (the temporary
directory, not /dev/shm). SQLite runs in WAL mode with synchronous=NORMAL: a commit is not flushed to the
disk (a power cut may lose the last ones, never corrupt the file), while PostgreSQL flushes its WAL at every
commit here. The comparison therefore leans toward SQLite on every path that writes.

``python bench/store_bench.py`` prints the section; ``--help`` for the rounds, the window, ``--only``, the lease and
the controllers' logs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine
from bench.controller_bench import CHANNELS, GENERATORS, WARMUP_SECONDS, Bench, _ms, eviction
from spotmorph.local.postgres import PostgresServer

AGENTS = 1000
ROUNDS = 2
MEASURE_SECONDS = 20.0  # per window: 20,000 heartbeats at 1,000 agents, 200 of them above the p99
STORES = ("SQLite", "PostgreSQL")
KINDS = ("heartbeat", "eviction")
DURABLE = {  # PostgreSQL's own defaults where PostgresServer's test settings trade durability for speed
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "autovacuum": "on",
    "shared_buffers": "128MB",
}
EXPIRY_SECONDS = 300.0  # registering 1,000 agents (41 s seen on PostgreSQL), then the floor: no node goes LOST
STEP_DOWN = "LEADING -> STANDBY"  # the controller's log line when it stops leading
Value = Callable[[dict[str, Any]], float | None]
HEADING = "## Controller on PostgreSQL vs SQLite (`bench/store_bench.py`)"


def _server_cpu(pid: int) -> float:
    """User + system CPU seconds of the postmaster ``pid``, its live children (the backends, each in a session
    of its own) and the children it reaped (Linux /proc)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if stat.parent.name == str(pid):
            total += sum(int(x) for x in fields[11:15])
        elif int(fields[1]) == pid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _timed(server: PostgresServer, what: Callable[[], Any]) -> tuple[Any, float]:
    """``what()`` and the share of one core the PostgreSQL server used meanwhile."""
    pid = server.pid or 0
    cpu, started = _server_cpu(pid), time.perf_counter()
    result = what()
    return result, (_server_cpu(pid) - cpu) / (time.perf_counter() - started)


@dataclass(frozen=True)
class Plan:
    """What a session runs: ``rounds`` of each store per kind, ``measure`` seconds per window, ``lease`` the
    PostgreSQL controller's ``--lease-seconds`` (None: its default), every round's controller log kept in ``logs``."""

    rounds: int = ROUNDS
    measure: float = MEASURE_SECONDS
    kinds: tuple[str, ...] = KINDS
    lease: float | None = None
    logs: Path | None = None

    def options(self, url: str | None) -> list[str]:
        """The controller's flags for a round on ``url`` (None: SQLite)."""
        if url is None:
            return []
        return ["--database", url] + ([] if self.lease is None else ["--lease-seconds", f"{self.lease:g}"])


def heartbeat_round(work: Path, server: PostgresServer, options: list[str], measure: float) -> dict[str, Any]:
    """One controller: register every agent, the health check's floor, then Heartbeat at 1 Hz."""
    bench = Bench(work, options, EXPIRY_SECONDS)
    try:
        started = time.perf_counter()
        bench.all("register", per=bench.share(AGENTS))
        registered = time.perf_counter() - started
        floor = bench.window("health", AGENTS, measure)
        beat, postgres_cpu = _timed(server, lambda: bench.window("heartbeat", AGENTS, measure))
    finally:
        bench.close()
    return {"register_seconds": registered, "health": floor, "heartbeat": beat, "postgres_cpu": postgres_cpu}


def _step_downs(work: Path) -> int:
    """How often the round's controller stopped leading (a PostgreSQL lease renewed too late)."""
    try:
        return (work / "controller.log").read_text(errors="replace").count(STEP_DOWN)
    except OSError:
        return 0


def _one_round(kind: str, work: Path, server: PostgresServer, options: list[str], plan: Plan) -> dict[str, Any]:
    if kind == "heartbeat":
        row = heartbeat_round(work, server, options, plan.measure)
    else:
        try:
            done, cpu = _timed(server, lambda: eviction(work, options, EXPIRY_SECONDS))
            row = dict(done, postgres_cpu=cpu)
        except (RuntimeError, EOFError) as exc:  # a generation not reached in time, a load generator's error
            row = {"failed": str(exc) or type(exc).__name__}
    return dict(row, step_downs=_step_downs(work))


def session(work: Path, plan: Plan) -> dict[str, list[dict[str, Any]]]:
    """Every round of both stores, alternating; one durable PostgreSQL server for the session."""
    results: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    with PostgresServer.start(settings=DURABLE, parent=Path(tempfile.gettempdir())) as server:
        for kind in plan.kinds:
            for number in range(plan.rounds):
                for store in STORES:
                    directory = work / f"{kind}-{number}-{store.lower()}"
                    directory.mkdir()
                    url = server.create_database(server.unique_name(kind)) if store == "PostgreSQL" else None
                    load = os.getloadavg()[0]
                    row = _one_round(kind, directory, server, plan.options(url), plan)
                    row.update(round=number + 1, store=store, load=load)
                    results[kind].append(row)
                    if plan.logs is not None:
                        shutil.copy(directory / "controller.log", plan.logs / f"{directory.name}.log")
                    print(f"  {kind} round {number + 1} {store}: {row}", flush=True)
    return results


def _mean(rows: list[dict[str, Any]], store: str, value: Value) -> float | None:
    values = [v for r in rows if r["store"] == store and (v := value(r)) is not None]
    return statistics.fmean(values) if values else None


def _quotient(top: float | None, bottom: float | None) -> str:
    return "-" if top is None or not bottom else f"{top / bottom:.2f}x"


def _ratio(rows: list[dict[str, Any]], value: Value) -> str:
    """PostgreSQL / SQLite of the rounds' means, and of each round's pair ('-' where a round has no figure)."""
    pairs = [_quotient(value(p), value(s)) for s, p in zip(rows[0::2], rows[1::2], strict=True)]
    mean = _quotient(_mean(rows, STORES[1], value), _mean(rows, STORES[0], value))
    return f"**{mean}** (by round: {', '.join(pairs)})"


def heartbeat_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| round | store | load (1 min) | health check p99 (ms, floor) | heartbeat p50 / p99 (ms, client) | "
        "heartbeat p50 / p99 (ms, server) | controller CPU per heartbeat (µs) | PostgreSQL server CPU "
        "(% of a core) | heartbeats answered | errors, health / heartbeat | registering 1,000 agents (s) | "
        "stopped leading (times) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        h, b = r["health"], r["heartbeat"]
        lines.append(
            f"| {r['round']} | {r['store']} | {r['load']:.1f} | {_ms(h['p99'])} | {_ms(b['p50'])} / {_ms(b['p99'])} | "
            f"{_ms(b['server_p50'])} / {_ms(b['server_p99'])} | {b['controller_cpu_us']:.0f} | "
            f"{r['postgres_cpu'] * 100:.1f} | {b['calls']} | {h['errors']} / {b['errors']} | "
            f"{r['register_seconds']:.1f} | {r['step_downs']} |"
        )
    return lines


def eviction_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| round | store | load (1 min) | notice -> every node of generation 2 (s) | the controller's morph (s) | "
        "registering 1,000 agents (s) | layout, nodes | PostgreSQL server CPU (% of a core) | "
        "stopped leading (times) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "failed" in r:
            lines.append(
                f"| {r['round']} | {r['store']} | {r['load']:.1f} | {r['failed']} | | | | | {r['step_downs']} |"
            )
            continue
        lines.append(
            f"| {r['round']} | {r['store']} | {r['load']:.1f} | {r['seconds']:.2f} | {r['issue_seconds']:.2f} | "
            f"{r['register_seconds']:.1f} | {r['layout']}, {r['gen2_nodes']} | {r['postgres_cpu'] * 100:.1f} | "
            f"{r['step_downs']} |"
        )
    return lines


def report(results: dict[str, list[dict[str, Any]]], plan: Plan, load: tuple[float, ...]) -> str:
    beats, evictions = results["heartbeat"], results["eviction"]
    lease = "its default lease (6 s)" if plan.lease is None else f"`--lease-seconds {plan.lease:g}`"
    lines = [
        HEADING,
        "",
        f"{machine()}. {AGENTS} simulated agents at 1 Hz ({GENERATORS} load-generator processes, {CHANNELS} "
        "channels each, as in `bench/controller_bench.py`) against a fresh `spotmorph controller` per round, "
        f"on SQLite or on PostgreSQL ({lease}), alternating, {plan.rounds} rounds each; per heartbeat round the "
        f"health check's floor then Heartbeat, {WARMUP_SECONDS:g} s warm-up and {plan.measure:g} s measured "
        "each. PostgreSQL: one local server on loopback for the session, with PostgreSQL's default durability "
        "(fsync, synchronous_commit and full_page_writes on) on the same disk as SQLite's file; SQLite: WAL "
        "with synchronous=NORMAL, which does not flush at commit. Load average when the run started: "
        f"{load[0]:.1f} (1 min), {load[1]:.1f} (5 min) on {os.cpu_count()} cores, which the controller, the "
        "load generators and PostgreSQL share.",
    ]
    if beats:
        lines += [
            "",
            *heartbeat_lines(beats),
            "",
            f"Heartbeat p99 PostgreSQL / SQLite, client side: {_ratio(beats, lambda r: r['heartbeat']['p99'])}; "
            f"server side: {_ratio(beats, lambda r: r['heartbeat']['server_p99'])}; controller CPU per "
            f"heartbeat: {_ratio(beats, lambda r: r['heartbeat']['controller_cpu_us'])}. Goal: p99 within 1.5x.",
        ]
    if evictions:
        lines += [
            "",
            *eviction_lines(evictions),
            "",
            f"Eviction convergence PostgreSQL / SQLite: {_ratio(evictions, lambda r: r.get('seconds'))}; the "
            f"controller's morph: {_ratio(evictions, lambda r: r.get('issue_seconds'))}.",
        ]
    return "\n".join(lines)


def run(plan: Plan | None = None) -> str:
    plan = plan or Plan()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="spotmorph-store-bench-") as tmp:
        results = session(Path(tmp), plan)
    return report(results, plan, load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of each store (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=MEASURE_SECONDS, help="measured seconds per window")
    parser.add_argument("--only", choices=KINDS, help="heartbeat latency only, or eviction convergence only")
    parser.add_argument("--lease-seconds", type=float, help="the PostgreSQL controller's lease (its default: 6)")
    parser.add_argument("--logs", type=Path, help="copy every round's controller log into this directory")
    args = parser.parse_args()
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
    kinds = (args.only,) if args.only else KINDS
    print(run(Plan(args.rounds, args.seconds, kinds, args.lease_seconds, args.logs)))


if __name__ == "__main__":
    main()
