"""``spotmorph local replay``: adds and evictions from an availability trace, time-scaled.

The trace's node counts are scaled so that its peak is ``max_nodes``; at each point the cluster is
brought to the scaled count by starting agents, or by evicting the newest VMs, with a notice through
the Scheduled Events service (``notice`` trace seconds, scaled like the rest) or killed (``notice`` 0).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from morphing.errors import UserInputError
from morphing.traces import Trace, parse_trace
from scheduler.pools import PoolKind
from spotmorph.local.flags import MAX_NOTICE_SECONDS, within
from spotmorph.local.platform import announce_eviction
from spotmorph.local.provider import LocalProcessProvider, kill_vm


@dataclass(frozen=True)
class ReplayOptions:
    speedup: float = 60.0  # trace seconds per wall second
    max_nodes: int = 4  # the trace's peak becomes this many nodes
    notice: float = 30.0  # eviction notice in trace seconds (0: kill)

    def check(self) -> None:
        within("--speedup", self.speedup, 0.001, 1e6, "trace seconds per wall second")
        if self.max_nodes < 1:
            raise UserInputError(f"--max-nodes {self.max_nodes}: give 1 or more")
        within("--notice", self.notice, 0, MAX_NOTICE_SECONDS, "trace seconds")


def load_trace(path: Path) -> Trace:
    try:
        return parse_trace(path.read_text(), what=f"trace {path}")
    except OSError as exc:
        raise UserInputError(f"trace {path} cannot be read ({exc.strerror})") from None


def targets(trace: Trace, max_nodes: int) -> list[tuple[float, int]]:
    """(trace seconds, how many nodes the cluster should have then), the peak scaled to ``max_nodes``."""
    points = trace.availability()
    peak = max((n for _, n in points), default=1) or 1
    return [(seconds, round(count * max_nodes / peak)) for seconds, count in points]


def replay(
    trace: Trace,
    provider: LocalProcessProvider,
    imds_url: str,
    options: ReplayOptions,
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Drive the cluster through the trace, in wall time ``trace seconds / speedup``."""
    options.check()
    start = clock()
    for seconds, want in targets(trace, options.max_nodes):
        delay = seconds / options.speedup - (clock() - start)
        if delay > 0:
            sleep(delay)
        live = [v for v in provider.vms() if v.alive() and v.pool is PoolKind.SPOT]  # a spot trace: spot VMs
        if want > len(live):
            provider.start(want - len(live))
            say(f"t={seconds:>8.0f}s  +{want - len(live)} node(s)")
        for vm in reversed(live[want:]):
            if options.notice > 0 and vm.node_name:
                announce_eviction(provider.cloud, imds_url, vm.name, vm.node_name, options.notice / options.speedup)
            else:
                kill_vm(vm)
            say(f"t={seconds:>8.0f}s  evict {vm.node_name or vm.name}")
