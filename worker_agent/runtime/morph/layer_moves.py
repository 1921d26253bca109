"""Layers sent point to point between the ranks of a generation: a morph's moves and a stop's hand-off.

A layer's payload (parameters and optimizer state) goes as its tensors' own bytes, no serialisation: per
move ``i`` (tags ``i * TAG_SPAN + k``) a header (the length of a JSON description: the payload with each
tensor replaced by its dtype and shape), the description, each non-empty tensor as it lies in memory, and a
trailer with the XXH3-128 checksum of those bytes in order. The sender hashes while its sends are in flight,
the receiver as each tensor arrives, so hashing overlaps the transfer; a receiver whose checksum differs says
so and every rank leaves memory for the disk (the callers' all-reduce). XXH3, not SHA-256: it guards against
a torn or misrouted transfer, not an adversary (a peer in the job runs its code anyway), and at about 10 GB/s
a core against SHA-256's 1.1 it no longer doubles the time a layer takes to move.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from morphing.transfer import Transfer
from worker_agent.runtime.storage.checkpoint import LayerPayload
from worker_agent.runtime.storage.streams import HASHERS, SHOWN, XXH3

TAG_SPAN = 1 << 16  # tags per move: header, description, tensors, trailer
MAX_DESCRIPTION_BYTES = 64 << 20
DIGEST_BYTES = 16  # the trailer: an XXH3-128, the checksum checkpoint files carry too
CHECKSUM = SHOWN[XXH3]
TENSOR = "__tensor__"


def describe(payload: Any, tensors: list[torch.Tensor]) -> Any:
    """``payload`` with each tensor replaced by ``{TENSOR: index, dtype, shape}`` (appended to ``tensors``)."""
    if isinstance(payload, torch.Tensor):
        tensors.append(payload.detach().cpu().contiguous())
        return {TENSOR: len(tensors) - 1, "dtype": str(payload.dtype).removeprefix("torch."), "shape": [*payload.shape]}
    if isinstance(payload, Mapping):
        return {str(k): describe(v, tensors) for k, v in payload.items()}
    if isinstance(payload, list | tuple):
        return [describe(v, tensors) for v in payload]
    if payload is None or isinstance(payload, bool | int | float | str):
        return payload
    raise TypeError(f"a layer payload holds a {type(payload).__name__}, which is not sent between ranks")


def allocate(description: Any, tensors: list[torch.Tensor]) -> Any:
    """The payload a description stands for, with empty tensors (appended to ``tensors``) to receive into."""
    if isinstance(description, dict) and TENSOR in description:
        dtype = getattr(torch, str(description["dtype"]), None)
        shape = description["shape"]
        if not isinstance(dtype, torch.dtype) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ValueError(f"a peer described a tensor as {description}")
        tensors.append(torch.empty(shape, dtype=dtype))
        return tensors[-1]
    if isinstance(description, dict):
        return {k: allocate(v, tensors) for k, v in description.items()}
    if isinstance(description, list):
        return [allocate(v, tensors) for v in description]
    return description


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes, as a uint8 view of the same memory."""
    return tensor.reshape(-1).view(torch.uint8)


def digest(tensors: Sequence[torch.Tensor]) -> str:
    h = HASHERS[XXH3]()
    for tensor in tensors:
        if tensor.numel():
            h.update(as_bytes(tensor).numpy().data)
    return h.hexdigest()


def _header(value: int) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.int64)


def _trailer(hexdigest: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(bytes.fromhex(hexdigest)), dtype=torch.uint8)


def move(
    layers: Mapping[int, LayerPayload], moves: Sequence[Transfer], rank: int, group: dist.ProcessGroup
) -> tuple[dict[int, LayerPayload], str]:
    """Send what this rank gives from ``layers``, receive what it lacks, over ``group`` (every rank, in rank
    order: :func:`worker_agent.runtime.pipeline.comm.peer_world`). Returns the payloads received by layer and why one
    is unusable ("" when none is)."""
    sends: list[Any] = []
    outgoing: list[tuple[int, Transfer, list[torch.Tensor]]] = []
    headers: dict[int, tuple[Transfer, torch.Tensor, Any]] = {}
    for i, transfer in enumerate(moves):
        base = i * TAG_SPAN
        if transfer.sender == rank:
            tensors: list[torch.Tensor] = []
            text = json.dumps(describe(layers[transfer.layer], tensors)).encode()
            if len(tensors) > TAG_SPAN - 3:  # the tags of one move: header, description, tensors, trailer
                raise ValueError(f"layer {transfer.layer} holds {len(tensors)} tensors; at most {TAG_SPAN - 3} move")
            blob = torch.frombuffer(bytearray(text), dtype=torch.uint8)
            to = transfer.receiver
            sends += [dist.isend(_header(len(text)), to, group, tag=base), dist.isend(blob, to, group, tag=base + 1)]
            sends += [dist.isend(as_bytes(t), to, group, tag=base + 2 + k) for k, t in enumerate(tensors) if t.numel()]
            outgoing.append((i, transfer, tensors))
        elif transfer.receiver == rank:
            header = torch.empty(1, dtype=torch.int64)
            headers[i] = (transfer, header, dist.irecv(header, transfer.sender, group, tag=base))
    for i, transfer, tensors in outgoing:  # hashed while the bytes are on their way
        last_tag = i * TAG_SPAN + TAG_SPAN - 1
        sends.append(dist.isend(_trailer(digest(tensors)), transfer.receiver, group, tag=last_tag))
    described = {}
    for i, (transfer, header, work) in headers.items():
        _wait(work)
        length = int(header[0])
        if not 0 < length <= MAX_DESCRIPTION_BYTES:
            raise ValueError(f"rank {transfer.sender} announced {length} bytes describing layer {transfer.layer}")
        blob = torch.empty(length, dtype=torch.uint8)
        described[i] = (transfer, blob, dist.irecv(blob, transfer.sender, group, tag=i * TAG_SPAN + 1))
    incoming = []
    for i, (transfer, blob, work) in described.items():
        _wait(work)
        tensors = []
        payload = allocate(json.loads(bytes(blob.numpy())), tensors)
        if len(tensors) > TAG_SPAN - 3:
            raise ValueError(f"rank {transfer.sender} described {len(tensors)} tensors for layer {transfer.layer}")
        base, src = i * TAG_SPAN, transfer.sender
        works = [
            dist.irecv(as_bytes(t), src, group, tag=base + 2 + k) if t.numel() else None for k, t in enumerate(tensors)
        ]
        trailer = torch.empty(DIGEST_BYTES, dtype=torch.uint8)
        last = dist.irecv(trailer, src, group, tag=base + TAG_SPAN - 1)
        incoming.append((transfer, payload, tensors, works, trailer, last))
    received: dict[int, LayerPayload] = {}
    bad = ""
    for transfer, payload, tensors, works, trailer, trailer_work in incoming:
        h = HASHERS[XXH3]()
        for tensor, work in zip(tensors, works, strict=True):  # each tensor hashed as soon as it is in
            if tensor.numel():
                _wait(work)
                h.update(as_bytes(tensor).numpy().data)
        _wait(trailer_work)
        if bytes(trailer.numpy()).hex() != h.hexdigest() and not bad:
            bad = f"layer {transfer.layer} from rank {transfer.sender} does not match its {CHECKSUM}"
        received[transfer.layer] = payload
    for work in sends:
        _wait(work)
    return received, bad


def agree(bad: str, group: dist.ProcessGroup) -> str:
    """Collective over ``group``: why some rank's moves are unusable ("" when every rank's are), the same on
    every rank."""
    flag = torch.tensor([1.0 if bad else 0.0], dtype=torch.float64)
    dist.all_reduce(flag, op=dist.ReduceOp.SUM, group=group)
    if flag.item() == 0:
        return ""
    return bad or f"another rank received a layer whose {CHECKSUM} does not match its sender's"


def _wait(work: Any) -> None:
    """A point-to-point operation's end (``None``: this rank was not in the group, nothing to wait for)."""
    if work is not None:
        work.wait()
