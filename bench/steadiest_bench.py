"""What choosing a layout by liveput costs the controller's planning (scheduler.layouts.steadiest).

Each generation the controller plans (``generation.fit``) is the planner's fastest on the nodes, then
``steadiest``: the best layout of every pipeline depth on as many alike GPUs, each judged by liveput at the spot
pool's rates. Measured on the GPT-48 profile at B 512, for 16, 32 and 64 one-GPU nodes: the fastest plan alone vs
the fastest plus ``steadiest``, each on a fresh planner (cold, as after a controller restart) and again on the same
planner (warm: its partitions and pipeline simulations cached), in a calm pool (the prior's rates: about an eviction
per ten node-hours) and a stormy one (1.2 an hour), and on the controller's ``MemoPlanner`` warm (what a growth
check asks again every pass). Baseline: the fastest plan alone, same run.

    .venv/bin/python -m bench.steadiest_bench
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bench.common import ROOT
from controller.shell.planning import MemoPlanner
from morphing.plan_result import Plan
from morphing.planner import Planner
from morphing.profile import parse_profile
from scheduler.forecast import PoolStats, Rates, rates
from scheduler.layouts import steadiest
from scheduler.pools import PoolKind

PROFILE = parse_profile((ROOT / "examples" / "profiles" / "gpt48.json").read_text())
POOLS = {"calm (prior)": rates(PoolStats(PoolKind.SPOT)), "stormy (1.2/h)": Rates(1.2 / 3600, 1 / 2520)}


def timed(work: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    out = work()
    return time.perf_counter() - started, out


def measure(planner: Planner, nodes: list[tuple[str, int]], spot: Rates) -> tuple[float, float, Plan]:
    """Seconds for the fastest plan, and for it plus ``steadiest``; the plan run."""
    alone, fastest = timed(lambda: planner.plan(nodes))
    assert isinstance(fastest, Plan)
    both, chosen = timed(lambda: steadiest(planner, nodes, fastest, spot))
    assert isinstance(chosen, Plan)
    return alone, alone + both, chosen


def row(gpus: int, pool: str, spot: Rates) -> str:
    nodes = [(f"vm-{i}", 1) for i in range(gpus)]
    cells = []
    for kind in ("cold", "warm", "memo"):
        planner = MemoPlanner(PROFILE, 512) if kind == "memo" else Planner(PROFILE, 512)
        if kind != "cold":
            measure(planner, nodes, spot)
        alone, both, chosen = measure(planner, nodes, spot)
        cells.append(f"{alone * 1e3:.1f} | {both * 1e3:.1f} | {both / alone:.1f}x")
    layout = f"{chosen.layout.pipeline_stages}x{chosen.layout.data_parallel}"
    return f"| {gpus} | {pool} | {' | '.join(cells)} | {layout} |"


def main() -> None:
    head = " | ".join(f"{k}: fastest (ms) | + steadiest (ms) | ratio" for k in ("cold", "warm", "MemoPlanner warm"))
    print(f"| GPUs | pool | {head} | layout run |")
    print("|---|---|" + "---|" * 10)
    for gpus in (16, 32, 64):
        for pool, spot in POOLS.items():
            print(row(gpus, pool, spot), flush=True)


if __name__ == "__main__":
    main()
