"""Each trainer on its own GPU: the agent turns an assignment's slots into device indices on the command line."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from morphing.jobspec import JobSpec
from morphing.layout import make_layout
from spotmorph.cli import main
from tests.agent.test_gpus import NVML_OLD_T4, _fake_pynvml
from worker_agent.agent.converge import Assignment, TrainerKey
from worker_agent.agent.daemon import Agent, AgentConfig
from worker_agent.agent.gpus import Gpu
from worker_agent.agent.supervisor import LaunchSpec, Supervisor
from worker_agent.agent.wire import Incoming
from worker_agent.contract import TrainerArguments

A100 = "NVIDIA A100 80GB PCIe"


def launch(tmp_path: Path) -> LaunchSpec:
    layout = make_layout(num_layers=4, pipeline_stages=2, data_parallel=2, micro_batch_size=2, global_batch=8)
    job = JobSpec(name="j", entrypoint="m.py:f", global_batch=8, steps=9, checkpoint_dir=str(tmp_path / "c"))
    return LaunchSpec(job, layout.to_dict(), "127.0.0.1:29500", tmp_path / "c")


class RecordingSupervisor:
    def __init__(self) -> None:
        self.started: list[tuple[TrainerKey, int | None]] = []

    def start(self, key: TrainerKey, spec: LaunchSpec, device_index: int | None = None) -> None:
        self.started.append((key, device_index))

    def reports(self) -> list[Any]:
        return []

    def forget(self, keep: set[tuple[str, int]]) -> None:
        pass


def started_devices(
    tmp_path: Path, gpus: tuple[Gpu, ...], slots: tuple[int, ...], node_slots: int | None = None
) -> list[int | None]:
    """The devices the agent starts ranks 2 and 3 on, placed in ``slots`` (the node has ``node_slots``:
    one per GPU, or as many as the assignment names on a node without GPUs)."""
    node_slots = node_slots if node_slots is not None else len(gpus) or max(slots) + 1
    agent = Agent(AgentConfig(("fake:1",), "t", tmp_path / "agent", slots=node_slots, gpus=gpus))
    recording = RecordingSupervisor()
    agent.supervisor = recording  # type: ignore[assignment]
    agent._apply(Incoming(Assignment("j", 1, "run", (2, 3), slots=slots), launch(tmp_path)))
    return [device for _key, device in recording.started]


def test_the_agent_starts_each_rank_on_the_gpu_of_its_slot(tmp_path: Path) -> None:
    two = (Gpu(0, A100, 1 << 36), Gpu(1, A100, 1 << 36))
    assert started_devices(tmp_path, two, (1, 0)) == [1, 0]
    chosen = (Gpu(6, A100, 1 << 36), Gpu(7, A100, 1 << 36))  # --gpus 6,7
    assert started_devices(tmp_path, chosen, (0, 1)) == [6, 7]


def test_a_node_without_gpus_starts_trainers_without_a_device(tmp_path: Path) -> None:
    assert started_devices(tmp_path, (), (0, 1)) == [None, None]


def test_a_slot_the_node_does_not_have_is_never_started(tmp_path: Path) -> None:
    """A controller's assignment is outside input: slot 5 of a 2-GPU node would put two ranks on one GPU."""
    two = (Gpu(0, A100, 1 << 36), Gpu(1, A100, 1 << 36))
    assert started_devices(tmp_path, two, (1, 5)) == [1]


def test_the_trainer_gets_its_device_index_and_cuda_in_pci_bus_order(tmp_path: Path) -> None:
    """A fake interpreter records the command line and environment the supervisor starts a trainer with."""
    seen = tmp_path / "seen"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$CUDA_DEVICE_ORDER" > {seen}.env\nprintf "%s\\n" "$@" > {seen}\n')
    python.chmod(0o755)
    supervisor = Supervisor(tmp_path / "trainers", python=str(python), env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    supervisor.start(TrainerKey("j", 1, 3), launch(tmp_path), device_index=1)
    deadline = time.monotonic() + 10
    while not (seen.exists() and seen.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    argv = seen.read_text().splitlines()
    assert argv[:2] == ["-m", "worker_agent.runtime.process.trainer"], shlex.join(argv)
    parsed = TrainerArguments.from_argv(argv[2:])
    assert (parsed.rank, parsed.device_index) == (3, 1)
    assert Path(f"{seen}.env").read_text().strip() == "PCI_BUS_ID"
    supervisor.kill_all()


def test_the_agent_command_refuses_more_slots_than_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real ``spotmorph agent`` entry on a node whose NVML lists two T4s (recorded output): exit 2, one line."""
    two_t4: list[tuple[object, int]] = list(NVML_OLD_T4)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(two_t4))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SPOTMORPH_GPUS", raising=False)
    monkeypatch.setenv("SPOTMORPH_AGENT_TOKEN", "t")
    argv = ["agent", "--controller", "127.0.0.1:1", "--slots", "3", "--work-dir", str(tmp_path / "agent")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("spotmorph agent: error: --slots 3: this node trains on 2 GPU(s) (2x Tesla T4"), err
    assert "use --slots 2 or fewer (or auto), or --gpus none to offer CPU slots" in err and "\n" not in err
    assert not (tmp_path / "agent").exists()  # refused before it did anything
