"""One rank of a 3x1 gloo world that takes peer snapshots, for test_snapshots.py.

``python snapshot_peer.py RANK PORT SCENARIO OUT``: a 3-stage pipeline of 6 layers, one rank a node; each step
the rank's state is ``payload(layer, step)``. Every boundary the ranks agree (one all-reduce, as the step loop's)
and the stream commits and begins snapshots (:class:`worker_agent.runtime.morph.snapshots.SnapshotStream`); each
rank then waits for its own stream to end (so the test does not race it), and the step's "collective" (another
all-reduce) comes before its update, as in a real step. Scenarios: ``kill`` (rank 2 is killed in step K+1, after
the snapshot of step K streamed whole) and ``midstream`` (rank 2 is killed while it sends its snapshot of step K).
The survivors then hold, say what (``holding``), choose the recovery (:func:`morphing.snapshots.choose_recovery`)
and, in a new world of two, take it through the held exchange into a 2x1 layout; each writes what it got and
whether every layer equals the state of the step chosen bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from morphing.layout import Layout, Slot, even_partition
from morphing.snapshots import Holding, choose_recovery
from morphing.transfer import stage_range
from worker_agent.contract import CommittedCheckpoint
from worker_agent.runtime.morph import snapshots
from worker_agent.runtime.morph.held import exchange, keep

LAYERS, K, GENERATION = 6, 3, 1
PEER_TIMEOUT = 3.0


def layout(stages: int) -> Layout:
    placement = tuple(Slot(f"n{r}", 0) for r in range(stages))
    return Layout(stages, 1, 1, 1, even_partition(LAYERS, stages), placement)


def payload(layer: int, step: int) -> dict[str, Any]:
    weight = torch.arange(500 * (layer + 1), dtype=torch.float64) * (step + 1) / 7 + layer
    state = {"step": torch.tensor(float(step)), "exp_avg": weight.sqrt(), "exp_avg_sq": weight * weight / 3}
    return {
        "format": "spotmorph.layer/v1",
        "layer": f"l{layer}",
        "tensors": {f"l{layer}.w": weight},
        "optimizer": {f"l{layer}.w": state},
    }


def same(got: Any, want: Any) -> bool:
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    return bool(got == want)


def kill_mid_send() -> None:
    """Rank 2's snapshot of step K: killed once a header, a description and a tensor went to gloo."""
    send, sent = dist.isend, [0]

    def isend(tensor: torch.Tensor, dst: int, group: dist.ProcessGroup, tag: int = 0) -> object:
        if sent[0] == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        sent[0] += 1
        return send(tensor, dst, group, tag=tag)

    dist.isend = isend  # type: ignore[assignment]


def train(rank: int, scenario: str, old: Layout) -> tuple[int, snapshots.SnapshotStream]:
    """Steps until a peer is lost; the live step and the stream."""
    plan = snapshots.applies(old, 1, True)
    stream = snapshots.open_stream(old, rank, 1, plan, PEER_TIMEOUT)
    stage = list(stage_range(old, rank))
    step = 0

    def copy(lease: object) -> tuple[dict[int, Any], None]:
        return {i: payload(i, step) for i in stage}, None

    try:
        while True:
            running, failed = stream.said()
            flags = torch.tensor([float(running), float(failed)], dtype=torch.float64)
            dist.all_reduce(flags)
            if rank == 2 and scenario == "midstream" and step == K:
                kill_mid_send()
            stream.at_boundary(step, float(flags[0]), float(flags[1]), copy)
            if stream.pending is not None:
                stream.pending.done.wait(30)
            if rank == 2 and step == K:  # in step K + 1, before its update
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(torch.zeros(1))  # the step's collective, before its update
            step += 1
    except RuntimeError:
        stream.settle()
        return step, stream


def main() -> None:
    rank, port, scenario, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    store = dist.TCPStore("127.0.0.1", port, 3, rank == 0, timedelta(seconds=30))  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=3, timeout=timedelta(seconds=30))
    old, new = layout(3), layout(2)
    step, stream = train(rank, scenario, old)
    own, received = stream.holding()
    live = {i: payload(i, step) for i in stage_range(old, rank)}
    held = snapshots.attach(keep(live, "job", GENERATION, step, old, rank, None), stream, "job", GENERATION)
    dist.destroy_process_group()
    # What the controller does with what every survivor says (here each computes it from both, alike).
    said = {0: (step, own, received)} if rank == 0 else {1: (step, own, received)}
    store2 = dist.TCPStore("127.0.0.1", port + 1, 2, rank == 0, timedelta(seconds=30))  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store2, rank=rank, world_size=2, timeout=timedelta(seconds=30))
    both: list[Any] = [None, None]
    dist.all_gather_object(both, said)
    holdings = {r: Holding(s, frozenset(o), frozenset(g)) for d in both for r, (s, o, g) in d.items()}
    recovery = choose_recovery(old, stream.plan, holdings, 0, step)
    needs = {r: frozenset(stage_range(new, r)) for r in range(2)}
    named = CommittedCheckpoint(recovery.step, GENERATION)
    names = [f"l{i}" for i in range(LAYERS)]
    outcome = exchange(held, "job", rank, new, needs, named, None, names, PEER_TIMEOUT)
    equal = outcome.used and all(same(outcome.payloads[f"l{i}"], payload(i, recovery.step)) for i in needs[rank])
    result = {
        "live": step,
        "own": list(own),
        "received": list(received),
        "recovery": [recovery.source.value, recovery.step, recovery.steps_lost],
        "used": outcome.used,
        "reason": outcome.reason,
        "same": equal,
    }
    with open(out, "w") as fh:
        json.dump(result, fh)
    os._exit(0)


if __name__ == "__main__":
    main()
