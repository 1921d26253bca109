"""Devices and precisions on a CPU machine: CUDA asked for without it exits 2 with the fix, the rank's GPU
index travels in the trainer's argv, autocast runs on the CPU, and checkpoint files hold CPU tensors."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from morphing.errors import UserInputError
from morphing.jobspec import JobSpec
from morphing.layout import make_layout
from spotmorph.cli import main
from tests.runtime.helpers import TINY, run
from worker_agent.contract import ExitCode, TrainerArguments, TrainerFailed, TrainersDir, read_progress
from worker_agent.runtime.numerics import device as device_mod
from worker_agent.runtime.numerics.device import compute_context, resolve_device
from worker_agent.runtime.numerics.stage_state import placed_state
from worker_agent.runtime.process.launcher import local_device
from worker_agent.runtime.storage.host_buffers import HostPool

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without CUDA gives")


@no_cuda
def test_cuda_without_cuda_is_a_user_error_naming_the_fix() -> None:
    with pytest.raises(UserInputError, match=r"torch.cuda.is_available\(\) is false.*use device cpu"):
        resolve_device("cuda", 0)
    assert resolve_device("auto", 3) == torch.device("cpu") == resolve_device("cpu", None)
    with pytest.raises(UserInputError, match="is_available"):
        local_device("cuda", 1)
    assert local_device("auto", 4) == "cpu"


def test_a_rank_gets_its_slot_gpu_and_a_missing_one_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_mod, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto", None) == torch.device("cuda", 0)
    assert resolve_device("cuda", 1) == torch.device("cuda", 1)
    with pytest.raises(UserInputError, match="given GPU 2, but the node has 2 visible"):
        resolve_device("cuda", 2)
    # spotmorph train: a GPU per rank, or the CPU when auto has too few.
    assert local_device("auto", 2) == "cuda"
    assert local_device("auto", 4) == "cpu"
    with pytest.raises(UserInputError, match="4 ranks need a GPU each, but this machine has 2"):
        local_device("cuda", 4)


def test_the_device_index_round_trips_through_the_trainer_argv(tmp_path: Path) -> None:
    arguments = TrainerArguments(tmp_path / "j", tmp_path / "l", 3, "h:1", tmp_path / "c", device_index=5)
    assert "--device-index=5" in arguments.to_argv()
    assert TrainerArguments.from_argv(arguments.to_argv()) == arguments
    unset = TrainerArguments(tmp_path / "j", tmp_path / "l", 3, "h:1", tmp_path / "c")
    assert not any(a.startswith("--device-index") for a in unset.to_argv())
    with pytest.raises(SystemExit) as info:
        TrainerArguments.from_argv([*unset.to_argv(), "--device-index=gpu0"])
    assert info.value.code == 2


@no_cuda
def test_spotmorph_train_with_device_cuda_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["train", TINY, f"--checkpoint-dir={tmp_path / 'c'}", "--global-batch=4", "--steps=1", "--device=cuda"])
    err = capsys.readouterr().err
    assert code == ExitCode.USER_ERROR, err
    assert "Traceback" not in err and err.count("\n") == 1 and "--device cpu" in err, err
    assert not (tmp_path / "c").exists()


@no_cuda
@pytest.mark.slow
def test_a_trainer_given_a_cuda_job_without_cuda_exits_2_before_the_rendezvous(tmp_path: Path) -> None:
    """The agent's path: nobody hosts the store (port 1), so only an early exit can pass."""
    directory = TrainersDir(tmp_path).generation_dir("job-1", 1)
    directory.path.mkdir(parents=True)
    layout = make_layout(num_layers=4, pipeline_stages=1, data_parallel=1, micro_batch_size=1, global_batch=4)
    directory.layout_file.write_text(json.dumps(layout.to_dict()))
    job = JobSpec(name="t", entrypoint=TINY, global_batch=4, steps=1, checkpoint_dir=str(tmp_path / "c"), device="cuda")
    directory.job_file.write_text(job.model_dump_json())
    arguments = TrainerArguments.in_generation_dir(directory, 0, "127.0.0.1:1", tmp_path / "c", device_index=0)
    result = run(arguments.command(sys.executable), timeout=60)
    assert result.returncode == ExitCode.USER_ERROR, result.explain()
    assert "Traceback" not in result.stderr and "is_available() is false" in result.stderr
    last = read_progress(directory.progress_file(0))[-1].event
    assert isinstance(last, TrainerFailed) and last.kind == "node"  # this node's lack: the controller leaves it out


def test_profile_with_device_cuda_or_float64_autocast_exits_2(tmp_path: Path) -> None:
    out = f"--out={tmp_path / 'p.json'}"
    assert main(["profile", TINY, "--precision=bf16", "--dtype=float64", out]) == 2
    if not torch.cuda.is_available():
        assert main(["profile", TINY, "--device=cuda", out]) == 2
    assert not (tmp_path / "p.json").exists()


def test_cpu_autocast_computes_in_bf16_and_fp32_computes_in_the_job_dtype() -> None:
    x = torch.randn(4, 4)
    with compute_context(torch.device("cpu"), "bf16")():
        assert (x @ x).dtype == torch.bfloat16
    with compute_context(torch.device("cpu"), "fp32")():
        assert (x @ x).dtype == torch.float32
        assert (x.double() @ x.double()).dtype == torch.float64


def test_host_copies_on_a_cpu_are_clones() -> None:
    x = torch.arange(6.0).view(2, 3).t()
    copy = HostPool().lease().copy("x", x)
    assert torch.equal(copy, x) and copy.data_ptr() != x.data_ptr() and copy.stride() == x.stride()


def test_a_layer_file_saved_from_a_gpu_loads_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files the runtime writes hold CPU tensors; one whose tensors were saved on cuda:0 (another writer)
    still loads here: the reader maps every storage to the CPU."""
    from torch import serialization

    from worker_agent.runtime.storage.checkpoint import serialise

    def tag_as_gpu(obj: object) -> str | None:
        return "cuda:0" if isinstance(obj, torch.storage.UntypedStorage) else None

    registry = serialization._package_registry
    monkeypatch.setattr(serialization, "_package_registry", list(registry))
    serialization.register_package(-100, tag_as_gpu, lambda obj, location: None)
    payload = {"format": "spotmorph.layer/v1", "layer": "l", "tensors": {"l.w": torch.ones(3)}, "optimizer": {}}
    data = serialise(payload)
    monkeypatch.setattr(serialization, "_package_registry", registry)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(io.BytesIO(data), weights_only=True)
    loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    assert loaded["tensors"]["l.w"].device.type == "cpu" and torch.equal(loaded["tensors"]["l.w"], torch.ones(3))


def test_loaded_optimizer_state_is_placed_as_torch_places_it() -> None:
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.AdamW([param])
    state = {"step": torch.tensor(4.0), "exp_avg": torch.ones(3, dtype=torch.float64), "flag": 1}
    placed = placed_state(optimizer, param, state)
    assert placed["step"].device.type == "cpu" and placed["step"] is not state["step"]
    assert placed["exp_avg"].dtype == torch.float32  # floating-point state follows its parameter
    assert placed["flag"] == 1


def test_aborting_communicators_is_best_effort_and_newest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker_agent.runtime.pipeline import comm

    aborted: list[str] = []

    class Group:
        def __init__(self, name: str, fails: bool) -> None:
            self.name, self.fails = name, fails

        def abort(self) -> None:
            aborted.append(self.name)
            if self.fails:
                raise RuntimeError("communicator already gone")

    communicators = comm.Communicators()
    for group in (Group("pipeline", False), Group("data", True), Group("tied", False)):
        communicators.add(group)  # type: ignore[arg-type]
    communicators.abort()
    assert aborted == ["tied", "data", "pipeline"]
    communicators.abort()
    assert aborted == ["tied", "data", "pipeline"], "each is aborted once"
    assert comm.tensor_backend(torch.device("cpu")) == "gloo" and comm.tensor_backend(torch.device("cuda", 1)) == "nccl"


def test_nccl_is_configured_to_raise_in_the_caller_not_to_tear_the_process_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The salvage needs a failed NCCL collective to raise before the optimizer step and the process to live on."""
    from worker_agent.runtime.pipeline.comm import configure_nccl

    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # what a user's environment might carry
    monkeypatch.delenv("TORCH_NCCL_BLOCKING_WAIT", raising=False)
    configure_nccl()
    assert os.environ["TORCH_NCCL_BLOCKING_WAIT"] == "1"
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
