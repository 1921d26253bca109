"""A planned morph through memory: what a trainer keeps when it stops, and how the next generation takes it.

After a planned stop at step ``S`` (or a failed collective after it) a trainer that may hold (the agent gave
it a hold spool and its node is not leaving) keeps every layer of its stage at ``S`` (its CPU tensors
themselves; host copies on a GPU) and waits for its next assignment instead of exiting.
The controller names ``S`` (``--held S:g``) in generation g+1's assignments; g+1's ranks, on whatever
processes they run, tell each other what they hold (one ``all_gather_object``), every rank computes the
same transfer plan (:func:`morphing.transfer.plan_transfer`) and the holders send the layers their new
owners lack over a group of every rank bounded by the job's peer timeout (gloo, host memory,
:func:`worker_agent.runtime.pipeline.comm.peer_world`), point to point, as their tensors' bytes with an XXH3-128
checksum (:mod:`worker_agent.runtime.morph.layer_moves`).

Any doubt leaves memory for the disk, the same on every rank: a holder of another job, step or layout, a
layer no survivor holds (unless ``S`` itself is the committed checkpoint), a checksum that does not match.
A peer that dies mid-transfer fails the collective and the generation, as any lost peer does. A generation
that ends before its stage loads the step (a failed exchange or rendezvous, its agent's abort) leaves what each
process held untouched, and the process holds it again; the next generation takes it when every layer is still
held, else resumes from the committed checkpoint. Either way what is loaded are exact copies of the tensors a
checkpoint would hold, so a morph through memory is bit for bit a morph through the disk.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from morphing.layout import Layout
from morphing.transfer import HeldSkipCause, SourceKind, TransferPlan, plan_transfer
from worker_agent.contract import CommittedCheckpoint, TrainerArguments, WarmAssignment, WarmSpool
from worker_agent.contract.wake import poke
from worker_agent.runtime.link.spool import wait_for_assignment
from worker_agent.runtime.model.partition import PartitionedModel
from worker_agent.runtime.morph.layer_moves import agree, move
from worker_agent.runtime.pipeline.comm import Communicators, peer_world
from worker_agent.runtime.storage import checkpoint as ckpt_mod
from worker_agent.runtime.storage.checkpoint import LayerPayload

if TYPE_CHECKING:
    from worker_agent.runtime.pipeline.engine import StageRunner

HOLD_SECONDS = 300.0  # how long a holder waits for the next generation before it lets its state go


@dataclass
class Held:
    """One trainer's state at ``step`` of ``generation``: its old stage's layers, by layer index.

    Nothing is copied or serialised when it stops: a layer it keeps becomes part of its new stage as it is,
    and only a layer a peer lacks is sent (its tensors' bytes) and hashed."""

    job_hash: str
    generation: int
    step: int
    layout: dict[str, Any]
    rank: int
    layers: dict[int, LayerPayload]
    loss_scale: dict[str, Any] | None = None
    snapshots: dict[int, Held] = field(default_factory=dict)  # peer snapshots of other steps, by step

    @property
    def nbytes(self) -> int:
        return sum(payload_bytes(payload) for payload in self.layers.values())

    def at(self, step: int) -> Held:
        """What this rank offers when the next generation is named ``step``: a peer snapshot of that step
        (:mod:`worker_agent.runtime.morph.snapshots`), else the live step (which the plan checks)."""
        return self if step == self.step else self.snapshots.get(step, self)

    def offer(self) -> Offer:
        sizes = {layer: payload_bytes(payload) for layer, payload in self.layers.items()}
        return Offer(self.job_hash, self.generation, self.step, self.layout, self.rank, sizes, self.loss_scale)


@dataclass(frozen=True)
class Offer:
    """What a rank tells the others it holds (small: no tensors)."""

    job_hash: str
    generation: int
    step: int
    layout: dict[str, Any]
    rank: int  # its rank in the old layout
    sizes: dict[int, int]  # the bytes of each layer's tensors (what balancing the senders weighs)
    loss_scale: dict[str, Any] | None = None


@dataclass(frozen=True)
class Decision:
    """The plan every rank follows, or why memory is not used (``plan`` None)."""

    plan: TransferPlan | None
    reason: str = ""
    offers: Mapping[int, Offer] = field(default_factory=dict)  # by new rank
    cause: HeldSkipCause | None = None  # with ``reason`` when ``plan`` is None


@dataclass(frozen=True)
class Outcome:
    """What this rank got: payloads by layer name, the layers still to read from the disk, the step."""

    used: bool
    reason: str = ""
    cause: HeldSkipCause | None = None  # with ``reason`` when not ``used``
    step: int = 0
    payloads: dict[str, LayerPayload] = field(default_factory=dict)
    from_disk: frozenset[int] = frozenset()
    loss_scale: dict[str, Any] | None = None
    bytes_received: int = 0


def payload_bytes(payload: LayerPayload) -> int:
    tensors = list(payload["tensors"].values())
    tensors += [v for state in payload["optimizer"].values() for v in state.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def keep(
    payloads: Mapping[int, LayerPayload],
    job_hash: str,
    generation: int,
    step: int,
    layout: Layout,
    rank: int,
    loss_scale: dict[str, Any] | None,
) -> Held:
    """What a stopping rank holds: ``payloads``, its stage's layers, by index."""
    return Held(job_hash, generation, step, layout.to_dict(), rank, dict(payloads), loss_scale)


def decide(
    offers: Sequence[Offer | None],
    layout: Layout,
    needs: Mapping[int, frozenset[int]],
    named: CommittedCheckpoint,
    resume: CommittedCheckpoint | None,
) -> Decision:
    """Pure: the same plan (or the same refusal) on every rank, from everyone's offers."""
    valid = {
        rank: offer
        for rank, offer in enumerate(offers)
        if offer is not None and (offer.step, offer.generation) == (named.step, named.generation)
    }
    if not valid:
        why = f"no trainer holds step {named.step} of generation {named.generation}"
        return Decision(None, why, cause=HeldSkipCause.NOT_HELD)
    layouts = {repr(sorted(o.layout.items())) for o in valid.values()}
    hashes = {o.job_hash for o in valid.values()}
    if len(layouts) != 1 or len(hashes) != 1:
        return Decision(
            None, "the trainers holding that step disagree on its layout or job", cause=HeldSkipCause.INCONSISTENT
        )
    old = Layout.from_dict(next(iter(valid.values())).layout)
    if old.num_layers != layout.num_layers:
        why = f"the held layout has {old.num_layers} layers, this one {layout.num_layers}"
        return Decision(None, why, cause=HeldSkipCause.INCONSISTENT)
    survivors = {o.rank: rank for rank, o in valid.items()}
    if len(survivors) != len(valid) or not all(0 <= r < old.world_size for r in survivors):
        return Decision(
            None,
            "two trainers claim the same old rank, or one outside the held layout",
            cause=HeldSkipCause.INCONSISTENT,
        )
    sizes = [max((o.sizes.get(layer, 0) for o in valid.values()), default=0) for layer in range(layout.num_layers)]
    holds = {o.rank: frozenset(o.sizes) for o in valid.values()}  # a stage, plus what a leaving rank handed it
    try:
        plan = plan_transfer(old, layout, survivors, sizes, needs=needs, holds=holds)
    except ValueError as exc:
        return Decision(None, f"the held state cannot be planned: {exc}", cause=HeldSkipCause.INCONSISTENT)
    missing = plan.from_disk()
    if missing and (resume is None or resume.step != named.step):
        held_by_none = ", ".join(str(layer) for layer in sorted(missing)[:8])
        why = f"layers {held_by_none} are held by no trainer and step {named.step} has no durable checkpoint"
        return Decision(None, why, cause=HeldSkipCause.LAYERS_MISSING)
    return Decision(plan, "", valid)


class ExchangeFailed(RuntimeError):
    """A peer was lost (or went silent) during the exchange: the process group is broken and the generation
    ends. Its processes hold the step again (:meth:`TrainerProcess.next_generation`); the next generation takes it
    from them when every layer is still held, else resumes from the newest committed checkpoint."""

    def __init__(self, message: str, cause: HeldSkipCause) -> None:
        super().__init__(message)
        self.cause = cause


def exchange(
    held: Held | None,
    job_hash: str,
    rank: int,
    layout: Layout,
    needs: Mapping[int, frozenset[int]],
    named: CommittedCheckpoint,
    resume: CommittedCheckpoint | None,
    layer_names: Sequence[str],
    peer_timeout: float,
) -> Outcome:
    """Collective over every rank of the generation, each calls it when ``named`` is set. A collective that
    fails (a peer gone, or silent for ``peer_timeout`` seconds) raises :class:`ExchangeFailed`."""
    mine: Offer | None = None
    held = held.at(named.step) if held is not None else None
    if held is not None and held.job_hash == job_hash:
        mine = held.offer()
    offers: list[Offer | None] = [None] * layout.world_size
    try:
        group = peer_world(layout.world_size, peer_timeout)
        dist.all_gather_object(offers, mine, group=group)
        decision = decide(offers, layout, needs, named, resume)
        if decision.plan is None:
            return Outcome(False, decision.reason, decision.cause)
        plan = decision.plan
        received, bad = move(held.layers if held is not None else {}, plan.transfers(), rank, group)
        why = agree(bad, group)
    except (RuntimeError, ConnectionError) as exc:  # gloo: a closed connection, or the peer timeout
        lost = f"the exchange of step {named.step} held by generation {named.generation} lost a peer"
        silent = "Timed out" in str(exc)  # gloo's words for a receive past the group's timeout
        cause = HeldSkipCause.PEER_TIMEOUT if silent else HeldSkipCause.PEER_LOST
        raise ExchangeFailed(f"{lost}: {str(exc)[:300]}", cause) from exc
    if why:
        return Outcome(False, why, HeldSkipCause.CHECKSUM_MISMATCH)
    payloads: dict[str, LayerPayload] = {}
    disk: set[int] = set()
    for (receiver, layer), source in plan.sources.items():
        if receiver != rank:
            continue
        if source.kind is SourceKind.OWN and held is not None:
            payloads[layer_names[layer]] = held.layers[layer]
        elif source.kind is SourceKind.PEER:
            payloads[layer_names[layer]] = received[layer]
        else:
            disk.add(layer)
    scale = next((o.loss_scale for o in decision.offers.values()), None)
    moved = sum(payload_bytes(payload) for payload in received.values())
    return Outcome(True, "", None, named.step, payloads, frozenset(disk), scale, moved)


def needs_of(model: PartitionedModel, layout: Layout) -> dict[int, frozenset[int]]:
    """Per rank of ``layout``, the layers whose state it loads (its stage's, and those its tied copies follow)."""
    out = {}
    for rank in range(layout.world_size):
        stage = layout.coords(rank)[1]
        out[rank] = frozenset(model.params[name].owner_layer for name, _ in model.stage_params(layout, stage))
    return out


def keep_stage(runner: StageRunner, job_hash: str, generation: int, step: int, rank: int) -> Held:
    """What this rank keeps at a planned stop: every layer of its stage (not only its share of the writes)."""
    layers = range(runner.first, runner.last)
    copies = runner.payloads(list(layers), share=True)
    payloads = {i: copies[runner.model.layer_names[i]] for i in layers}
    scale = runner.loss_scale.to_dict() if runner.scaling else None
    return keep(payloads, job_hash, generation, step, runner.layout, rank, scale)


def take(
    held: Held | None,
    cfg: TrainerArguments,
    layout: Layout,
    job_hash: str,
    runner: StageRunner,
    skipped: Callable[[HeldSkipCause, str], None],
) -> Outcome:
    """The generation's exchange (a collective: every rank calls it when its assignment names a held step);
    ``skipped`` hears why memory is not used (a failed exchange raises :class:`ExchangeFailed` instead)."""
    named = cfg.held
    assert named is not None
    needs = needs_of(runner.model, layout)
    names = runner.model.layer_names
    peer = runner.job.peer_timeout_seconds
    return reported(lambda: exchange(held, job_hash, cfg.rank, layout, needs, named, cfg.resume, names, peer), skipped)


def reported(run: Callable[[], Outcome], skipped: Callable[[HeldSkipCause, str], None]) -> Outcome:
    """``run()``'s outcome, with why memory is not used told to ``skipped`` first. A failed exchange
    (:class:`ExchangeFailed`) is not a skip: the generation ends, its processes hold the step again, and the next
    generation is named it once more (it says ``skipped`` only if it cannot take it)."""
    outcome = run()
    if not outcome.used:
        assert outcome.cause is not None
        skipped(outcome.cause, outcome.reason)
    return outcome


def apply(memory: Outcome, runner: StageRunner, chosen: str | None, job: Mapping[str, Any]) -> int:
    """Load what memory gave into the stage, and the layers no survivor held from the committed checkpoint."""
    model = runner.model
    names = {n for n, _ in runner.params if model.params[n].owner_layer not in memory.from_disk}
    runner.apply(memory.payloads.values(), memory.loss_scale, names, adopt=True)  # nobody else writes them
    if memory.from_disk:
        assert chosen is not None  # decide() reads from the disk only when the held step is the committed one
        runner.load(ckpt_mod.verify(Path(chosen), job, read_files=False), memory.from_disk)
    return memory.step


def hold(
    spool_path: Path, kept: Held, parent: int, communicators: Communicators, code: int = 0
) -> WarmAssignment | None:
    """Let go of this generation's process groups, say what is held and how the generation ended (``code``: 0 for
    a stop; a failure when it ended before taking ``kept``, which it holds again), and wait for the next assignment."""
    if dist.is_initialized():
        communicators.abort()
        dist.destroy_process_group()
    spool = WarmSpool(spool_path)
    spool.path.mkdir(parents=True, exist_ok=True)
    facts = {"generation": kept.generation, "step": kept.step, "pid": os.getpid(), "bytes": kept.nbytes, "code": code}
    temporary = spool.held_file.with_suffix(".tmp")
    temporary.write_text(json.dumps(facts))
    temporary.replace(spool.held_file)
    poke()  # the agent reports this generation's end at once, not at its next look
    return wait_for_assignment(spool, parent, time.monotonic() + HOLD_SECONDS)
