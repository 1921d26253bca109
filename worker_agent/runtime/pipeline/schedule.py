"""The order a stage runs its micro-batches in: GPipe (every forward, then every backward) or 1F1B (after a
warm-up of ``stages - stage`` forwards, one backward per forward, so at most that many micro-batches' activations
are alive), and forward only for evaluation.

Each micro-batch's computation is the same in every order and its gradients are accumulated in micro-batch
order in both, so the schedule changes memory and bubbles, not results. The point-to-point operations are
issued as ``torch.distributed.pipelining`` issues them: a send that would otherwise wait on a receive queued
behind it on the same link (NCCL runs both on one stream) goes out in one ``batch_isend_irecv`` with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from worker_agent.runtime.pipeline.pipeline_stage import Stage

LossFn = Callable[[Any, torch.Tensor], torch.Tensor]


def _start(ops: list[dist.P2POp]) -> list[dist.Work]:
    """Issue ``ops`` (one link's, in order): sends alone or receives alone one by one, a mix as one batch."""
    if not ops:
        return []
    if len({op.op for op in ops}) == 1:
        return [work for op in ops if (work := op.op(op.tensor, op.peer, op.group)) is not None]
    return [work for work in dist.batch_isend_irecv(ops) if work is not None]


def _wait(works: list[dist.Work]) -> None:
    for work in works:
        work.wait()


class Schedule:
    """Runs one step's micro-batches through ``stage``; the last stage computes each one's loss."""

    def __init__(self, stage: Stage, n_micro: int, loss_fn: LossFn, kind: str) -> None:
        if kind not in ("gpipe", "1f1b"):
            raise ValueError(f"unknown schedule {kind!r}")
        self.stage = stage
        self.n_micro = n_micro
        self.loss_fn = loss_fn
        self.kind = kind
        self._losses: dict[int, torch.Tensor] = {}

    def step(self, *args: torch.Tensor, target: torch.Tensor | None, losses: list[torch.Tensor] | None) -> None:
        """Forward and backward of every micro-batch of ``args`` (the whole batch, on the first stage);
        ``losses`` gets each micro-batch's loss on the last stage."""
        self._run(args, target, losses, backward=True)

    def eval(self, *args: torch.Tensor, target: torch.Tensor | None, losses: list[torch.Tensor] | None) -> None:
        """Forward only (the caller turns gradients off)."""
        self._run(args, target, losses, backward=False)

    def _run(
        self,
        args: tuple[torch.Tensor, ...],
        target: torch.Tensor | None,
        losses: list[torch.Tensor] | None,
        backward: bool,
    ) -> None:
        splits = [a.tensor_split(self.n_micro) for a in args]
        chunks = [tuple(parts[i] for parts in splits) for i in range(self.n_micro)]
        targets = list(target.tensor_split(self.n_micro)) if target is not None else []
        self._losses.clear()
        try:
            if not backward:
                self._forward_only(chunks, targets)
            elif self.kind == "gpipe":
                self._gpipe(chunks, targets)
            else:
                self._one_f_one_b(chunks, targets)
        except BaseException:
            self.stage.forget()
            self._losses.clear()
            raise
        if losses is not None and self.stage.is_last:
            losses.extend(self._losses[i] for i in range(self.n_micro))
        self._losses.clear()

    def _forward(self, chunk: int, chunks: list[tuple[torch.Tensor, ...]], targets: list[torch.Tensor]) -> None:
        output = self.stage.forward(chunk, chunks[chunk])
        if self.stage.is_last:
            self._losses[chunk] = self.loss_fn(output, targets[chunk])

    def _backward(self, chunk: int) -> None:
        self.stage.backward(chunk, self._losses.get(chunk) if self.stage.is_last else None)

    def _forward_only(self, chunks: list[tuple[torch.Tensor, ...]], targets: list[torch.Tensor]) -> None:
        sends: list[dist.Work] = []
        for i in range(self.n_micro):
            _wait(_start(self.stage.fwd_recv_ops(i)))
            self._forward(i, chunks, targets)
            sends += _start(self.stage.fwd_send_ops(i))
        _wait(sends)

    def _gpipe(self, chunks: list[tuple[torch.Tensor, ...]], targets: list[torch.Tensor]) -> None:
        self._forward_only(chunks, targets)
        sends: list[dist.Work] = []
        for i in range(self.n_micro):
            _wait(_start(self.stage.bwd_recv_ops(i)))
            self._backward(i)
            sends += _start(self.stage.bwd_send_ops(i))
        _wait(sends)

    def _one_f_one_b(self, chunks: list[tuple[torch.Tensor, ...]], targets: list[torch.Tensor]) -> None:
        stage, n = self.stage, self.n_micro
        warmup = min(n, stage.num_stages - stage.index)
        forwards = backwards = 0
        sending: list[dist.Work] = []
        fwd_sends: list[dist.P2POp] = []
        for _ in range(warmup):
            _wait(_start(stage.fwd_recv_ops(forwards)))
            self._forward(forwards, chunks, targets)
            _wait(sending)
            sending = []
            fwd_sends = stage.fwd_send_ops(forwards)
            if forwards != warmup - 1:  # the last warm-up send goes out with the first backward's receive
                sending, fwd_sends = _start(fwd_sends), []
            forwards += 1
        bwd_sends: list[dist.P2POp] = []
        while True:
            _wait(_start(fwd_sends + stage.bwd_recv_ops(backwards)))
            self._backward(backwards)
            bwd_sends = stage.bwd_send_ops(backwards)
            backwards += 1
            if forwards == n:
                break
            _wait(_start(bwd_sends + stage.fwd_recv_ops(forwards)))
            self._forward(forwards, chunks, targets)
            fwd_sends = stage.fwd_send_ops(forwards)
            forwards += 1
        sending = _start(bwd_sends)  # nothing else is in flight: the last warm-up send went out fused
        while backwards < n:
            _wait(_start(stage.bwd_recv_ops(backwards)))
            self._backward(backwards)
            _wait(sending)
            sending = _start(stage.bwd_send_ops(backwards))
            backwards += 1
        _wait(sending)
