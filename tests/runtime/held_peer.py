"""One rank of a gloo world that moves held layers (``worker_agent.runtime.morph.held.exchange``), for test_held.py.

``python held_peer.py RANK WORLD PORT SCENARIO OUT``: old layout 2 stages x 1 replica (layers 0-1, 2-3),
new layout 1 stage x WORLD replicas; new ranks 0 and 1 held old ranks 0 and 1, the others nothing.
Scenarios: ``move``; ``corrupt`` (rank 1 sends a wrong checksum with each layer); ``die`` (rank 1 is
killed mid-transfer: once the first tensor of its first layer is on its way, before the rest); ``silent``
(rank 1 tells the others what it holds, then sends nothing and stays alive, past the peer timeout). With
WORLD 2, at the stop of the old layout (``worker_agent.runtime.morph.handoff.hand_off``): ``handoff`` (rank 1
leaves and hands its stage to rank 0) and ``handoff-corrupt`` (with a wrong checksum).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from morphing.layout import make_layout
from worker_agent.contract import CommittedCheckpoint
from worker_agent.runtime.morph import layer_moves
from worker_agent.runtime.morph.handoff import hand_off
from worker_agent.runtime.morph.held import Offer, exchange, keep, reported
from worker_agent.runtime.pipeline.comm import peer_world

LAYERS = 4
NAMED = CommittedCheckpoint(step=5, generation=1)
PEER_TIMEOUT = 2.0  # the world group's is 30 s: a receive bounded by this one gave up on the peer timeout


def payload(layer: int) -> dict[str, object]:
    weight = torch.arange(1000 * (layer + 1), dtype=torch.float64) / (layer + 1)
    state = {"step": torch.tensor(5.0), "exp_avg": weight * 0.5}
    return {
        "format": "spotmorph.layer/v1",
        "layer": f"l{layer}",
        "tensors": {f"l{layer}.w": weight},
        "optimizer": {f"l{layer}.w": state},
    }


def main() -> None:
    rank, world, port, scenario, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    store = dist.TCPStore(  # type: ignore[attr-defined]  # exported at runtime, not in the stubs
        "127.0.0.1", port, world, rank == 0, timedelta(seconds=30)
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=30))
    old = make_layout(num_layers=LAYERS, pipeline_stages=2, data_parallel=1, micro_batch_size=1, global_batch=6)
    new = make_layout(num_layers=LAYERS, pipeline_stages=1, data_parallel=world, micro_batch_size=1, global_batch=6)
    held = None
    if rank < 2:
        first, last = old.stage_layers[rank]
        held = keep({i: payload(i) for i in range(first, last)}, "job", 1, 5, old, rank, None)
        if scenario.endswith("corrupt") and rank == 1:  # what it sends says a checksum its bytes do not have
            layer_moves._trailer = lambda hexdigest: torch.zeros(layer_moves.DIGEST_BYTES, dtype=torch.uint8)
    if scenario == "die" and rank == 1:
        send, sent = dist.isend, [0]

        def isend(tensor: torch.Tensor, dst: int, group: dist.ProcessGroup, tag: int = 0) -> object:
            if sent[0] == 3:  # a header, a description and a tensor handed to gloo: the process is killed
                os.kill(os.getpid(), signal.SIGKILL)
            sent[0] += 1
            return send(tensor, dst, group, tag=tag)

        dist.isend = isend  # type: ignore[assignment]
    if scenario == "silent" and rank == 1:
        assert held is not None
        offers: list[Offer | None] = [None] * world
        dist.all_gather_object(offers, held.offer(), group=peer_world(world, PEER_TIMEOUT))
        others = [Path(out).with_name(f"rank-{r}.json") for r in range(world) if r != rank]
        deadline = time.monotonic() + 25  # alive and silent until the others gave up (before the world's 30 s)
        while not all(o.exists() for o in others) and time.monotonic() < deadline:
            time.sleep(0.1)
        os._exit(0)
    if scenario.startswith("handoff"):
        assert held is not None
        handed = hand_off(held, rank == 1, old, rank, PEER_TIMEOUT)
        expected = {i: payload(i)["tensors"] for i in held.layers}
        same = all(torch.equal(held.layers[i]["tensors"][f"l{i}.w"], expected[i][f"l{i}.w"]) for i in held.layers)  # type: ignore[index]
        facts = {"ok": handed.ok, "reason": handed.reason, "layers": sorted(held.layers), "same": same}
        with open(out, "w") as fh:
            json.dump(facts | {"sent": handed.sent, "received": handed.received}, fh)
        os._exit(0)
    needs = {r: frozenset(range(LAYERS)) for r in range(world)}
    told: list[tuple[str, str]] = []
    names = [f"l{i}" for i in range(LAYERS)]
    try:
        outcome = reported(
            lambda: exchange(held, "job", rank, new, needs, NAMED, None, names, PEER_TIMEOUT),
            lambda cause, why: told.append((cause.value, why)),
        )
    except Exception as exc:
        cause = getattr(exc, "cause", None)
        result: dict[str, object] = {"raised": repr(exc), "told": told, "cause": cause.value if cause else None}
    else:
        same = outcome.used and all(
            torch.equal(outcome.payloads[f"l{i}"]["tensors"][f"l{i}.w"], payload(i)["tensors"][f"l{i}.w"])  # type: ignore[index]
            and torch.equal(
                outcome.payloads[f"l{i}"]["optimizer"][f"l{i}.w"]["exp_avg"],
                payload(i)["optimizer"][f"l{i}.w"]["exp_avg"],  # type: ignore[index]
            )
            for i in range(LAYERS)
        )
        result = {"used": outcome.used, "reason": outcome.reason, "same": same, "received": outcome.bytes_received}
        result["told"] = told
    with open(out, "w") as fh:
        json.dump(result, fh)
    os._exit(0)


if __name__ == "__main__":
    main()
