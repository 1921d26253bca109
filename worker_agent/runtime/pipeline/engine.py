"""One rank's share of a training step: its pipeline stage, gradient reduction, clipping and update.

The batch invariant lives here. Replica ``d`` takes its contiguous slice of the step's ``B`` sample indices,
pads its last micro-batch with weight-0 copies so every micro-batch has ``m`` samples, and each micro-batch
contributes ``sum(weight * per-sample loss) / B``; in token mode ``sum(weight * per-token loss) / N`` with ``N``
the non-ignored targets of all ``B`` samples, counted from the step's indices before it runs.
Gradients are summed over replicas per stage, and tied copies over every rank that holds one, so the
update is the same whatever the layout. On a GPU the stage's layers, the micro-batches and the optimizer
state live on the rank's device; parameters and optimizer state stay in the job's dtype (the masters) and
bf16 / fp16 only change what the forward computes in. fp16 multiplies the loss by a layout-free loss
scale (:mod:`worker_agent.runtime.numerics.loss_scale`); a step whose gradients overflow on any rank is skipped by
every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from morphing.errors import UserInputError
from morphing.jobspec import JobSpec
from morphing.layout import Layout, share_of
from worker_agent.runtime.model.partition import PartitionedModel
from worker_agent.runtime.numerics.batch import (
    as_tuple,
    check_loss_shape,
    count_target_tokens,
    map_tensors,
    signature,
    stack_samples,
    weighted_loss,
)
from worker_agent.runtime.numerics.device import compute_context, synchronize
from worker_agent.runtime.numerics.dropout import Masks
from worker_agent.runtime.numerics.exact import ExactGradients, clip_coefficient
from worker_agent.runtime.numerics.job import step_indices, torch_dtype
from worker_agent.runtime.numerics.loss_scale import LossScale
from worker_agent.runtime.numerics.stage_state import (
    all_reduce_coalesced,
    placed_state,
    scale_in_place,
    squared_norm,
    state_of,
)
from worker_agent.runtime.pipeline.comm import Groups
from worker_agent.runtime.pipeline.pipeline_stage import Batch, Stage
from worker_agent.runtime.pipeline.schedule import Schedule
from worker_agent.runtime.storage.checkpoint import Checkpoint, LayerPayload, load_tensors
from worker_agent.runtime.storage.host_buffers import HostLease, HostPool


def _loss_share(values: list[float], scale: float) -> float:
    """Summed in Python floats in micro-batch order, as on a CPU."""
    return float(sum(values)) / scale


class StageRunner:
    def __init__(
        self,
        job: JobSpec,
        layout: Layout,
        rank: int,
        model: PartitionedModel,
        groups: Groups,
        device: torch.device | None = None,
        masks: Masks | None = None,
    ) -> None:
        self.job = job
        self.dtype = torch_dtype(job.dtype)
        self.device = device or torch.device("cpu")
        self.compute = compute_context(self.device, job.precision)
        self.scaling = job.precision == "fp16"
        self.loss_scale = LossScale()
        self.layout = layout
        self.rank = rank
        self.model = model
        self.groups = groups
        self.replica, self.stage = layout.coords(rank)
        self.spec = model.spec
        module = model.stage_module(layout, self.stage, job.activation_recomputation, self.compute)
        module.to(self.device)  # before the optimizer sees the parameters; masters keep the job's dtype
        module.train()
        self.module = module
        self.params = model.stage_params(layout, self.stage)
        self.optimizer = self.spec.optimizer(self.params)
        self.first, self.last = layout.stage_layers[self.stage]
        self.is_first = self.stage == 0
        self.is_last = self.stage == layout.pipeline_stages - 1
        self.host = HostPool()  # host buffers of its checkpoints, reused from one to the next
        self.batch = Batch()
        self.batch.micro_batch_size = layout.micro_batch_size
        self.share = share_of(layout, self.replica, job.micro_batch_size if job.exact else None)
        self.n_micro = -(-(self.share[1] - self.share[0]) // layout.micro_batch_size)
        units = -(-job.global_batch // layout.micro_batch_size)
        uses = max(len(info.layers) for info in model.params.values())
        self.exact = ExactGradients(model.stage_leaves(layout, self.stage), units, uses) if job.exact else None
        self.signature = signature(self.spec.dataset[0])
        where = (groups.replica, self.device, self.batch)
        stage = Stage(module, self.stage, layout.pipeline_stages, *where, job.seed, self.exact, masks)
        use_gpipe = job.schedule == "gpipe" or self.n_micro < layout.pipeline_stages
        self.schedule_name = "gpipe" if use_gpipe else "1f1b"
        self.schedule = Schedule(stage, self.n_micro, self._loss, self.schedule_name)
        self.before_update: Callable[[], None] | None = None  # waits for a write that reads the live tensors

    def _loss(self, output: Any, slots: torch.Tensor) -> torch.Tensor:
        targets = self.batch.targets[slots]
        with self.compute():
            per_item = self.spec.loss(output, targets)
        problem = check_loss_shape(per_item, targets, self.spec.loss_normalization)
        if problem is not None:
            raise UserInputError(problem)
        loss = weighted_loss(
            per_item, targets, self.batch.weights[slots], self.spec.loss_normalization, self.batch.denominator
        )
        return loss * self.loss_scale.scale if self.scaling and not self.batch.evaluating else loss

    def _prepare(self, dataset: Any, step: int, indices: list[int], fill: int) -> tuple[torch.Tensor, ...]:
        """The batch state for this replica's ``indices``, padded with weight-0 copies of item ``fill``;
        returns the first stage's inputs."""
        pad = self.n_micro * self.layout.micro_batch_size - len(indices)
        rows = indices + [fill] * pad
        self.batch.step = step
        self.batch.sample_ids = self._upload(torch.tensor(indices + [-1] * pad, dtype=torch.long))
        self.batch.weights = self._upload(torch.tensor([1.0] * len(indices) + [0.0] * pad, dtype=self.dtype))
        args: tuple[torch.Tensor, ...] = ()
        if self.is_first or self.is_last:
            inputs, targets = stack_samples([dataset[i] for i in rows], self.signature)
            self.batch.targets = self._cast(targets)
            if self.is_first:
                args = as_tuple(map_tensors(inputs, self._cast))
        return args

    def evaluate(self, step: int) -> float:
        """Mean loss over the whole ``eval_dataset``, forward only with dropout off; the same in every layout.

        Chunk ``k`` holds eval items ``[kB, (k+1)B)``, cut among replicas as a step's batch is; every sample
        (token, in token mode) weighs 1 / its count over the whole set, so the sum over chunks and ranks is
        the mean, normalised as training normalises.
        """
        data = self.spec.eval_dataset
        if data is None:
            raise UserInputError("eval_interval is set but the model's spec has no eval_dataset")
        size, batch = len(data), self.job.global_batch
        lo, hi = self.share
        token = self.spec.loss_normalization == "token"
        self.batch.denominator = float(max(1, count_target_tokens(data, list(range(size))) if token else size))
        slots = torch.arange(self.n_micro * self.layout.micro_batch_size, device=self.device)
        values: list[float] = []
        self.batch.evaluating = True
        self.module.eval()
        try:
            with torch.no_grad():
                for start in range(0, size, batch):
                    chunk = list(range(start, min(start + batch, size)))[lo:hi]
                    args = self._prepare(data, step, chunk, fill=start)
                    losses: list[torch.Tensor] = []
                    target = slots if self.is_last else None
                    self.schedule.eval(*args, target=target, losses=losses if self.is_last else None)
                    values += torch.stack(losses).double().cpu().tolist() if losses else []
        finally:
            self.module.train()
            self.batch.evaluating = False
        total = torch.tensor([float(sum(values))], dtype=torch.float64)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return float(total[0])

    def run_step(self, step: int) -> float:
        """Forward, backward, reduce, clip and update for ``step``; returns this replica's loss share.

        Every collective comes before the optimizer update, so a step that fails in one (a peer lost)
        leaves the parameters, the optimizer state and the loss scale at the last completed step.
        """
        scale = self.loss_scale
        try:
            return self._step(step)
        except BaseException:
            self.loss_scale = scale  # fp16: the overflow all-reduce may have moved it before a later failure
            raise

    def _step(self, step: int) -> float:
        job, layout = self.job, self.layout
        dataset = self.spec.dataset
        lo, hi = self.share
        indices = step_indices(step, job.global_batch, len(dataset), job.seed)[lo:hi]
        padded = self.n_micro * layout.micro_batch_size
        fill = indices[0]
        if job.exact:  # a short last micro-batch is filled with its own first sample, as in every layout
            fill = indices[(len(indices) - 1) // layout.micro_batch_size * layout.micro_batch_size]
        args = self._prepare(dataset, step, indices, fill=fill)
        if self.is_last:
            self.batch.denominator = float(job.global_batch)
            if self.spec.loss_normalization == "token":
                every = step_indices(step, job.global_batch, len(dataset), job.seed)
                self.batch.denominator = float(max(1, count_target_tokens(dataset, every)))
        losses: list[torch.Tensor] = []
        slots = torch.arange(padded, device=self.device)
        target = slots if self.is_last else None
        self.schedule.step(*args, target=target, losses=losses if self.is_last else None)
        scale = self.loss_scale.scale if self.scaling else 1.0
        if self.exact is not None:
            self.exact.finish(self.params, self.groups.data_parallel, self.groups.tied)
        else:
            self._reduce_gradients()
        if self.scaling:
            values, finite = self._read_losses(losses, self._all_finite())
            if not self._unscale(finite):
                self.optimizer.zero_grad(set_to_none=True)
                return _loss_share(values, scale) if self.is_last else 0.0
        self._clip()
        for group in self.optimizer.param_groups:
            group["lr"] = self.spec.lr_schedule(step) * group.get("lr_scale", 1.0)
        if self.before_update is not None:
            self.before_update()
            self.before_update = None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.exact is not None:
            self.model.sync_copies(self.layout, self.stage)
        if not self.scaling:  # the step's one wait for the device: every kernel of the update is queued by now
            values, _ = self._read_losses(losses, None)
        return _loss_share(values, scale) if self.is_last else 0.0

    def _read_losses(self, losses: list[torch.Tensor], flag: torch.Tensor | None) -> tuple[list[float], bool]:
        """The micro-batches' losses (and ``flag``, fp16's all-finite test) in one device-to-host copy."""
        parts = [x.detach().double().reshape(1) for x in losses]
        if flag is not None:
            parts.append(flag.to(device=self.device, dtype=torch.float64).reshape(1))
        if not parts:
            return [], True
        values = torch.cat(parts).cpu().tolist()
        if flag is None:
            return values, True
        return values[:-1], bool(values[-1])

    def _all_finite(self) -> torch.Tensor:
        grads = [p.grad for _, p in self.params if p.grad is not None]
        if not grads:
            return torch.ones((), device=self.device)
        return torch.stack([torch.isfinite(g).all() for g in grads]).all()

    def _cast(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._upload(tensor.to(self.dtype) if tensor.is_floating_point() else tensor)

    def _upload(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on this rank's device; to a GPU from pinned memory, so the host does not wait for it."""
        if self.device.type == "cuda" and tensor.device.type == "cpu":
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=True)

    def _unscale(self, finite: bool) -> bool:
        """fp16: whether this step may update (no rank saw an inf or NaN; ``finite``: this rank's gradients
        are); divides gradients by the scale.

        The overflow flag is all-reduced over every rank (the world's control group), so all ranks skip or
        take the step together and move the scale the same way.
        """
        grads = [p.grad for _, p in self.params if p.grad is not None]
        flag = torch.tensor([0.0 if finite else 1.0], dtype=torch.float64)
        dist.all_reduce(flag, op=dist.ReduceOp.SUM)
        overflow = bool(flag[0] > 0)
        inverse = 1.0 / self.loss_scale.scale  # a power of two: unscaling is exact
        self.loss_scale = self.loss_scale.after(overflow)
        if not overflow:
            for grad in grads:
                grad.mul_(inverse)
        return not overflow

    def _reduce_gradients(self) -> None:
        for _, param in self.params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        plain = [p for n, p in self.params if n not in self.groups.tied]
        if self.groups.data_parallel is not None and plain:
            all_reduce_coalesced([p.grad for p in plain if p.grad is not None], self.groups.data_parallel)
        for name, param in self.params:
            group = self.groups.tied.get(name)
            if group is not None and param.grad is not None:
                dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=group)

    def _clip(self) -> None:
        max_norm = self.spec.clip_grad_norm
        if max_norm is None:
            return
        if self.exact is not None:
            owned_squares = {
                n: float(p.grad.detach().double().pow(2).sum())
                for n, p in self.params
                if p.grad is not None and self.model.owned_by_stage(self.layout, n, self.stage)
            }
            coef = clip_coefficient(owned_squares, list(self.model.params), self.groups.pipeline, max_norm, self.device)
            self._scale_gradients(coef)
            return
        owned = [
            p.grad
            for n, p in self.params
            if p.grad is not None and self.model.owned_by_stage(self.layout, n, self.stage)
        ]
        squares = squared_norm(owned, self.device)
        if self.groups.pipeline is not None:
            dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=self.groups.pipeline)
        # On the device, as torch's clip_grad_norm_: no wait for the norm. A coefficient clamped to 1
        # multiplies by 1, which changes no bit, as not scaling did.
        clip = (max_norm / (squares.sqrt() + 1e-6)).clamp(max=1.0)
        if self.device.type == "cpu" and float(clip) >= 1.0:
            return  # a CPU reads the coefficient without waiting: skip the pass that would change nothing
        scale_in_place([p.grad for _, p in self.params if p.grad is not None], clip)

    def _scale_gradients(self, coef: float) -> None:
        if coef < 1.0:
            for _, param in self.params:
                if param.grad is not None:
                    param.grad.mul_(coef)

    def layers_to_write(self) -> list[int]:
        """This rank's share of its stage's layer files: spread round-robin over the replicas."""
        return [i for i in range(self.first, self.last) if (i - self.first) % self.layout.data_parallel == self.replica]

    def payloads(
        self, layers: list[int] | None = None, lease: HostLease | None = None, share: bool = False
    ) -> dict[str, LayerPayload]:
        """Host copies of the tensors this rank writes (``layers``: these instead of its share), taken at the
        step boundary (pinned memory on a GPU) into ``lease``'s buffers (one of :attr:`host`, released by the
        writer once written); without one, into fresh buffers. ``share``: the CPU tensors themselves, not
        copies, for a rank that trains no more (what a stopped generation keeps for the next) or whose next
        update waits for the write that reads them (:attr:`before_update`).

        The file format does not depend on the device: every tensor in it is a CPU tensor.
        """
        lease = lease if lease is not None else HostPool().lease()
        held = dict(self.params)
        out: dict[str, LayerPayload] = {}

        def take(name: str, tensor: torch.Tensor) -> torch.Tensor:
            return tensor.detach() if share and tensor.device.type == "cpu" else lease.copy(name, tensor)

        for layer in self.layers_to_write() if layers is None else layers:
            names = self.model.layer_params(layer)
            out[self.model.layer_names[layer]] = {
                "format": "spotmorph.layer/v1",
                "layer": self.model.layer_names[layer],
                "tensors": {n: take(n, held[n]) for n in names},
                "optimizer": {n: state_of(take, n, self.optimizer.state.get(held[n], {})) for n in names},
            }
        synchronize(self.device)  # the copies to pinned memory are asynchronous
        return out

    def needed_layers(self) -> frozenset[int]:
        """The layers whose state this rank loads: those of record for every parameter its stage holds."""
        return frozenset(self.model.params[name].owner_layer for name, _ in self.params)

    def load(self, ckpt: Checkpoint, layers: frozenset[int] | None = None) -> None:
        """Parameters and optimizer state of this stage from ``ckpt`` (any writer layout, precision or device);
        with ``layers``, only the parameters of record of those layers."""
        names = {n for n, _ in self.params if layers is None or self.model.params[n].owner_layer in layers}
        files = load_tensors(ckpt, names)
        scale = ckpt.manifest.loss_scale.model_dump() if ckpt.manifest.loss_scale is not None else None
        self.apply(files.values(), scale, names)

    def apply(
        self,
        payloads: Iterable[LayerPayload],
        loss_scale: dict[str, Any] | None,
        names: set[str] | None = None,
        adopt: bool = False,
    ) -> None:
        """Take ``payloads`` (layer files' contents, from the disk or from peers' memory) into this stage;
        ``adopt``: tensors nobody else writes become the parameters and state where they fit, uncopied."""
        found: dict[str, tuple[torch.Tensor, dict[str, Any]]] = {}
        for payload in payloads:
            for n, tensor in payload["tensors"].items():
                found[n] = (tensor, payload["optimizer"].get(n, {}))
        with torch.no_grad():
            for name, param in self.params:
                if names is not None and name not in names:
                    continue
                tensor, state = found[name]
                if tensor.shape != param.shape or tensor.dtype != param.dtype:
                    raise ValueError(f"checkpoint tensor {name} is {tensor.dtype}{list(tensor.shape)}")
                if adopt and tensor.device == param.device and tensor.stride() == param.stride():
                    param.data = tensor
                else:
                    param.copy_(tensor)
                if state:
                    self.optimizer.state[param] = placed_state(self.optimizer, param, state, copy=not adopt)
        if self.scaling and loss_scale is not None:
            self.loss_scale = LossScale.from_dict(loss_scale)
        if self.exact is not None:
            self.model.sync_copies(self.layout, self.stage)
