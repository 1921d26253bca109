"""One rank's pipeline stage: its layers' forward and backward a micro-batch at a time, and the point-to-point
operations that move a micro-batch's boundary tensors to the next stage and their gradients back
(:mod:`worker_agent.runtime.pipeline.schedule` orders them).

The runtime's own rather than ``torch.distributed.pipelining``'s, whose stages infer what crosses a boundary by
running the stage once more on a generation's first micro-batch (a forward, and a backward after the first
stage: in the step that ends every morph's pause), and whose API is still a prototype's. Here what crosses is
said once, on the first micro-batch a stage sends: a small integer header (how many tensors, each one's dtype
and shape). Every floating tensor
that crosses gets a gradient back (zeros where the next stage's backward gave it none), so both sides know
what moves without asking again. A stage tells layout-free dropout which samples each micro-batch holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from morphing.errors import UserInputError
from worker_agent.runtime.model.model_api import sample_context
from worker_agent.runtime.numerics.batch import as_tuple
from worker_agent.runtime.numerics.dropout import Masks
from worker_agent.runtime.numerics.exact import ExactGradients

# The dtypes a boundary tensor may have, by their index in the header.
DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)


class Batch:
    """The current step's per-slot targets, weights and sample ids (read by the loss and dropout)."""

    def __init__(self) -> None:
        self.step = 0
        self.targets = torch.empty(0)
        self.weights = torch.empty(0)
        self.sample_ids = torch.empty(0, dtype=torch.long)
        self.micro_batch_size = 1
        self.denominator = 1.0  # B, or the step's non-ignored target tokens in token mode
        self.evaluating = False  # forward only: the loss is not scaled


@dataclass(frozen=True)
class Boundary:
    """What one micro-batch sends from a stage to the next: each tensor's dtype and shape, in order."""

    tensors: tuple[tuple[torch.dtype, tuple[int, ...]], ...]

    @classmethod
    def of(cls, outputs: tuple[Any, ...], stage: int) -> Boundary:
        for value in outputs:
            if not isinstance(value, torch.Tensor):
                raise UserInputError(
                    f"stage {stage}'s last layer returned a {type(value).__name__}; a layer that ends a stage must "
                    "return a tensor or a tuple of tensors (they are what is sent to the next stage)"
                )
            if value.dtype not in DTYPES:
                raise UserInputError(f"stage {stage} would send a {value.dtype} tensor; supported: {DTYPES}")
        return cls(tuple((t.dtype, tuple(t.shape)) for t in outputs))

    def encode(self) -> list[int]:
        out = [len(self.tensors)]
        for dtype, shape in self.tensors:
            out += [DTYPES.index(dtype), len(shape), *shape]
        return out

    @classmethod
    def decode(cls, values: list[int]) -> Boundary:
        tensors, at = [], 1
        for _ in range(values[0]):
            dtype, ndim = DTYPES[values[at]], values[at + 1]
            tensors.append((dtype, tuple(values[at + 2 : at + 2 + ndim])))
            at += 2 + ndim
        return cls(tuple(tensors))

    def floating(self) -> list[tuple[torch.dtype, tuple[int, ...]]]:
        return [(d, s) for d, s in self.tensors if d.is_floating_point]


class Stage:
    """One stage of one replica's pipeline; its neighbours are the ranks ``stage_index +- 1`` of ``group``."""

    def __init__(
        self,
        module: torch.nn.Module,
        stage_index: int,
        num_stages: int,
        group: dist.ProcessGroup,
        device: torch.device,
        batch: Batch,
        seed: int,
        exact: ExactGradients | None,
        masks: Masks | None = None,
    ) -> None:
        self.module = module
        self.index = stage_index
        self.num_stages = num_stages
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.group = group
        self.device = device
        self.prev = -1 if self.is_first else dist.get_global_rank(group, stage_index - 1)
        self.next = -1 if self.is_last else dist.get_global_rank(group, stage_index + 1)
        self._batch = batch
        self._seed = seed
        self._masks = masks or Masks()  # what dropout keeps from one micro-batch to the next
        self._exact = exact
        self._sends: Boundary | None = None  # said to the next stage once
        self._receives: Boundary | None = None  # heard from the previous stage once
        self._saved: dict[int, tuple[tuple[Any, ...], tuple[torch.Tensor, ...]]] = {}  # chunk: outputs, inputs
        self._inputs: dict[int, tuple[torch.Tensor, ...]] = {}
        self._output_grads: dict[int, tuple[torch.Tensor, ...]] = {}
        self._input_grads: dict[int, tuple[torch.Tensor, ...]] = {}
        self._outgoing: dict[int, tuple[torch.Tensor, ...]] = {}

    def forward(self, chunk: int, args: tuple[torch.Tensor, ...]) -> Any:
        """This stage's layers on micro-batch ``chunk`` (``args`` on the first stage, what was received on
        another); keeps what its backward needs while gradients are on."""
        training = torch.is_grad_enabled()
        if self.is_first:
            inputs = args
        else:
            inputs = tuple(x.requires_grad_(training and x.is_floating_point()) for x in self._inputs.pop(chunk))
        m = self._batch.micro_batch_size
        ids = self._batch.sample_ids[chunk * m : (chunk + 1) * m]
        with sample_context(self._seed, self._batch.step, ids, self._masks):
            output = self.module(*inputs)
        outputs = as_tuple(output)
        if training:  # the last stage's backward starts from its loss: it keeps no outputs
            self._saved[chunk] = ((), inputs) if self.is_last else (outputs, inputs)
        if not self.is_last:
            self._outgoing[chunk] = tuple(t.detach().contiguous() for t in outputs)
        return output

    def backward(self, chunk: int, loss: torch.Tensor | None) -> None:
        """Gradients of micro-batch ``chunk`` into the parameters (from its loss on the last stage, from the
        gradients received on another), and of its received inputs for the previous stage."""
        outputs, inputs = self._saved.pop(chunk)
        if self.is_last:
            assert loss is not None
            torch.autograd.backward(loss)
        else:
            floating = [t for t in outputs if t.is_floating_point()]
            pairs = [(t, g) for t, g in zip(floating, self._output_grads.pop(chunk), strict=True) if t.requires_grad]
            if pairs:
                torch.autograd.backward([t for t, _ in pairs], grad_tensors=[g for _, g in pairs])
        if not self.is_first:
            self._input_grads[chunk] = tuple(
                x.grad if x.grad is not None else torch.zeros_like(x) for x in inputs if x.is_floating_point()
            )
        if self._exact is not None:
            self._exact.take()  # exact mode: this micro-batch's gradients, summed in integers

    def fwd_recv_ops(self, chunk: int) -> list[dist.P2POp]:
        if self.is_first:
            return []
        if self._receives is None:
            self._receives = self._hear()
        buffers = tuple(torch.empty(s, dtype=d, device=self.device) for d, s in self._receives.tensors)
        self._inputs[chunk] = buffers
        return [dist.P2POp(dist.irecv, b, self.prev, self.group) for b in buffers]

    def fwd_send_ops(self, chunk: int) -> list[dist.P2POp]:
        if self.is_last:
            return []
        tensors = self._outgoing.pop(chunk)
        boundary = Boundary.of(tensors, self.index)
        if self._sends is None:
            self._say(boundary)
            self._sends = boundary
        elif boundary != self._sends:
            raise UserInputError(
                f"stage {self.index} sends {boundary.tensors} on micro-batch {chunk} but sent {self._sends.tensors} "
                "before: what a layer that ends a stage returns must keep its shapes and dtypes from one "
                "micro-batch to the next (pad the inputs to one length)"
            )
        return [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]

    def bwd_recv_ops(self, chunk: int) -> list[dist.P2POp]:
        if self.is_last:
            return []
        assert self._sends is not None
        buffers = tuple(torch.empty(s, dtype=d, device=self.device) for d, s in self._sends.floating())
        self._output_grads[chunk] = buffers
        return [dist.P2POp(dist.irecv, b, self.next, self.group) for b in buffers]

    def bwd_send_ops(self, chunk: int) -> list[dist.P2POp]:
        if self.is_first:
            return []
        grads = tuple(g.contiguous() for g in self._input_grads.pop(chunk))
        return [dist.P2POp(dist.isend, g, self.prev, self.group) for g in grads]

    def forget(self) -> None:
        """Drop what a step that failed midway left (activations, buffers); the header stays said."""
        for held in (self._saved, self._inputs, self._output_grads, self._input_grads, self._outgoing):
            held.clear()

    def _say(self, boundary: Boundary) -> None:
        header = torch.tensor(boundary.encode(), dtype=torch.int64, device=self.device)
        dist.send(torch.tensor([header.numel()], dtype=torch.int64, device=self.device), self.next, self.group)
        dist.send(header, self.next, self.group)

    def _hear(self) -> Boundary:
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        dist.recv(size, self.prev, self.group)
        header = torch.zeros(int(size[0]), dtype=torch.int64, device=self.device)
        dist.recv(header, self.prev, self.group)
        return Boundary.decode([int(v) for v in header.cpu().tolist()])
