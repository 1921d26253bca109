"""One rank's share of a training step: its pipeline stage, gradient reduction, clipping and update.

The batch invariant lives here. Replica ``d`` takes its contiguous slice of the step's ``B`` sample
indices, pads its last micro-batch with weight-0 copies so every micro-batch has ``m`` samples, and each
micro-batch contributes ``sum(weight * per-sample loss) / B`` (the schedule's own 1/n scaling is off); in
token mode ``sum(weight * per-token loss) / N`` with ``N`` the non-ignored targets of all ``B`` samples,
counted from the step's indices before it runs.
Gradients are summed over replicas per stage, and tied copies over every rank that holds one, so the
update is the same whatever the layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from morphing.errors import UserInputError
from morphing.jobspec import JobSpec
from morphing.layout import Layout
from worker_agent.runtime.batch import (
    as_tuple,
    check_loss_shape,
    count_target_tokens,
    map_tensors,
    signature,
    stack_samples,
    weighted_loss,
)
from worker_agent.runtime.checkpoint import Checkpoint, LayerPayload, load_tensors
from worker_agent.runtime.job import step_indices, torch_dtype
from worker_agent.runtime.model_api import sample_context
from worker_agent.runtime.partition import PartitionedModel


@dataclass(frozen=True)
class Groups:
    """Process groups this rank belongs to (``None`` where the group would have one member)."""

    replica: dist.ProcessGroup
    pipeline: dist.ProcessGroup | None
    data_parallel: dist.ProcessGroup | None
    tied: dict[str, dist.ProcessGroup]


def make_groups(layout: Layout, model: PartitionedModel, rank: int) -> Groups:
    """Create every group in the same order on every rank (a collective requirement), keep ours."""
    p, d = layout.pipeline_stages, layout.data_parallel
    replica, stage = layout.coords(rank)
    pipeline = data_parallel = own = None
    for r in range(d):
        group = dist.new_group([layout.rank(r, s) for s in range(p)])
        if r == replica:
            own = group
            pipeline = group if p > 1 else None
    for s in range(p):
        group = dist.new_group([layout.rank(r, s) for r in range(d)])
        if s == stage and d > 1:
            data_parallel = group
    tied: dict[str, dist.ProcessGroup] = {}
    for name, holders in model.tied_across_stages(layout):
        group = dist.new_group(sorted(layout.rank(r, s) for r in range(d) for s in holders))
        if stage in holders:
            tied[name] = group
    assert own is not None
    return Groups(own, pipeline, data_parallel, tied)


class _Batch:
    """The current step's per-slot targets, weights and sample ids (read by the loss and dropout)."""

    def __init__(self) -> None:
        self.step = 0
        self.targets = torch.empty(0)
        self.weights = torch.empty(0)
        self.sample_ids = torch.empty(0, dtype=torch.long)
        self.micro_batch_size = 1
        self.denominator = 1.0  # B, or the step's non-ignored target tokens in token mode


class _Stage(PipelineStage):
    """A PipelineStage that tells layout-free dropout which samples each micro-batch holds."""

    def __init__(self, batch: _Batch, seed: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._batch = batch
        self._seed = seed

    def forward_one_chunk(
        self,
        fwd_chunk_id: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None = None,
        save_forward_output: bool = True,
    ) -> Any:
        m = self._batch.micro_batch_size
        ids = self._batch.sample_ids[fwd_chunk_id * m : (fwd_chunk_id + 1) * m]
        with sample_context(self._seed, self._batch.step, ids):
            return super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)


class StageRunner:
    def __init__(self, job: JobSpec, layout: Layout, rank: int, model: PartitionedModel, groups: Groups) -> None:
        self.job = job
        self.dtype = torch_dtype(job.dtype)
        self.layout = layout
        self.rank = rank
        self.model = model
        self.groups = groups
        self.replica, self.stage = layout.coords(rank)
        self.spec = model.spec
        self.params = model.stage_params(layout, self.stage)
        self.optimizer = self.spec.optimizer(self.params)
        self.first, self.last = layout.stage_layers[self.stage]
        self.is_first = self.stage == 0
        self.is_last = self.stage == layout.pipeline_stages - 1
        self.batch = _Batch()
        self.batch.micro_batch_size = layout.micro_batch_size
        self.n_micro = layout.micro_batches_per_replica[self.replica]
        module = model.stage_module(layout, self.stage)
        module.train()
        pipe_stage = _Stage(
            self.batch,
            job.seed,
            submodule=module,
            stage_index=self.stage,
            num_stages=layout.pipeline_stages,
            device=torch.device("cpu"),
            group=groups.replica,
        )
        use_gpipe = job.schedule == "gpipe" or self.n_micro < layout.pipeline_stages
        schedule_cls = ScheduleGPipe if use_gpipe else Schedule1F1B
        self.schedule_name = "gpipe" if use_gpipe else "1f1b"
        self.schedule = schedule_cls(pipe_stage, self.n_micro, loss_fn=self._loss, scale_grads=False)
        self.signature = signature(self.spec.dataset[0])

    def _loss(self, output: Any, slots: torch.Tensor) -> torch.Tensor:
        targets = self.batch.targets[slots]
        per_item = self.spec.loss(output, targets)
        problem = check_loss_shape(per_item, targets, self.spec.loss_normalization)
        if problem is not None:
            raise UserInputError(problem)
        return weighted_loss(
            per_item, targets, self.batch.weights[slots], self.spec.loss_normalization, self.batch.denominator
        )

    def run_step(self, step: int) -> float:
        """Forward, backward, reduce, clip and update for ``step``; returns this replica's loss share."""
        job, layout = self.job, self.layout
        dataset = self.spec.dataset
        lo, hi = layout.replica_slice(self.replica)
        indices = step_indices(step, job.global_batch, len(dataset), job.seed)[lo:hi]
        padded = self.n_micro * layout.micro_batch_size
        pad = padded - len(indices)
        rows = indices + [indices[0]] * pad
        self.batch.step = step
        self.batch.sample_ids = torch.tensor(indices + [-1] * pad, dtype=torch.long)
        self.batch.weights = torch.tensor([1.0] * len(indices) + [0.0] * pad, dtype=self.dtype)
        args: tuple[torch.Tensor, ...] = ()
        if self.is_first or self.is_last:
            inputs, targets = stack_samples([dataset[i] for i in rows], self.signature)
            self.batch.targets = self._cast(targets)
            if self.is_first:
                args = as_tuple(map_tensors(inputs, self._cast))
        if self.is_last:
            self.batch.denominator = float(job.global_batch)
            if self.spec.loss_normalization == "token":
                every = step_indices(step, job.global_batch, len(dataset), job.seed)
                self.batch.denominator = float(max(1, count_target_tokens(dataset, every)))
        losses: list[torch.Tensor] = []
        slots = torch.arange(padded)
        target = slots if self.is_last else None
        self.schedule.step(*args, target=target, losses=losses if self.is_last else None)
        self._reduce_gradients()
        self._clip()
        for group in self.optimizer.param_groups:
            group["lr"] = self.spec.lr_schedule(step) * group.get("lr_scale", 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(sum(float(x.detach()) for x in losses)) if self.is_last else 0.0

    def _cast(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.dtype) if tensor.is_floating_point() else tensor

    def _reduce_gradients(self) -> None:
        for _, param in self.params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        plain = [p for n, p in self.params if n not in self.groups.tied]
        if self.groups.data_parallel is not None and plain:
            _all_reduce_coalesced([p.grad for p in plain if p.grad is not None], self.groups.data_parallel)
        for name, param in self.params:
            group = self.groups.tied.get(name)
            if group is not None and param.grad is not None:
                dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=group)

    def _clip(self) -> None:
        max_norm = self.spec.clip_grad_norm
        if max_norm is None:
            return
        owned = [p.grad for n, p in self.params if self.model.owned_by_stage(self.layout, n, self.stage)]
        squares = torch.zeros((), dtype=torch.float64)
        for grad in owned:
            if grad is not None:
                squares += grad.detach().double().pow(2).sum()
        if self.groups.pipeline is not None:
            dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=self.groups.pipeline)
        coef = max_norm / (math.sqrt(float(squares)) + 1e-6)
        if coef < 1.0:
            for _, param in self.params:
                if param.grad is not None:
                    param.grad.mul_(coef)

    def layers_to_write(self) -> list[int]:
        """This rank's share of its stage's layer files: spread round-robin over the replicas."""
        return [i for i in range(self.first, self.last) if (i - self.first) % self.layout.data_parallel == self.replica]

    def payloads(self) -> dict[str, LayerPayload]:
        """Copies of the tensors this rank writes, taken at the step boundary."""
        held = dict(self.params)
        out: dict[str, LayerPayload] = {}
        for layer in self.layers_to_write():
            names = self.model.layer_params(layer)
            out[self.model.layer_names[layer]] = {
                "format": "spotmorph.layer/v1",
                "layer": self.model.layer_names[layer],
                "tensors": {n: held[n].detach().clone() for n in names},
                "optimizer": {n: _copy_state(self.optimizer.state.get(held[n], {})) for n in names},
            }
        return out

    def load(self, ckpt: Checkpoint) -> None:
        """Parameters and optimizer state of this stage from ``ckpt`` (any writer layout)."""
        names = {n for n, _ in self.params}
        files = load_tensors(ckpt, names)
        found: dict[str, tuple[torch.Tensor, dict[str, Any]]] = {}
        for payload in files.values():
            for n, tensor in payload["tensors"].items():
                found[n] = (tensor, payload["optimizer"].get(n, {}))
        with torch.no_grad():
            for name, param in self.params:
                tensor, state = found[name]
                if tensor.shape != param.shape or tensor.dtype != param.dtype:
                    raise ValueError(f"checkpoint tensor {name} is {tensor.dtype}{list(tensor.shape)}")
                param.copy_(tensor)
                if state:
                    self.optimizer.state[param] = _copy_state(state)


def _copy_state(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def _all_reduce_coalesced(grads: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """One SUM all-reduce over a flat copy of ``grads`` (many tiny all-reduces cost latency each)."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def module_for_dtype(model: PartitionedModel, dtype: torch.dtype) -> None:
    """Convert every layer (shared parameters stay shared) to the job's dtype."""
    nn.ModuleList(model.modules).to(dtype)
