"""GPU discovery without a GPU: each probe's recorded output parsed, the order of probes, slots to devices."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from morphing.errors import UserInputError
from morphing.gpus import describe_gpus, gpu_label
from worker_agent.agent import gpu_probe
from worker_agent.agent.gpus import (
    Gpu,
    choose,
    describe,
    device_for_slot,
    gpus_from_nvml,
    gpus_from_torch,
    parse_gpu_choice,
    parse_slots,
    slot_count,
    trainer_environment,
)

H100 = Gpu(0, "NVIDIA H100 80GB HBM3", 85_520_809_984)

# nvmlDeviceGetName / nvmlDeviceGetMemoryInfo().total per device, as recorded on three kinds of VM
NVML_ND_H100_V5 = [("NVIDIA H100 80GB HBM3", 85_520_809_984)] * 8
NVML_NC_A100_V4 = [("NVIDIA A100 80GB PCIe", 85_899_345_920)]
NVML_OLD_T4 = [(b"Tesla T4", 16_106_127_360), (b"Tesla T4", 16_106_127_360)]  # nvidia-ml-py < 11.5: bytes

TORCH_ON_CPU_BUILD = '{"cuda": null, "devices": []}\n'
TORCH_ON_TWO_A100 = (
    '{"cuda": "12.4", "devices": [{"index": 0, "name": "NVIDIA A100-SXM4-40GB", "memory_bytes": 42298834944}, '
    '{"index": 1, "name": "NVIDIA A100-SXM4-40GB", "memory_bytes": 42298834944}]}\n'
)


def test_nvml_output_becomes_gpus_in_nvml_order() -> None:
    eight = gpus_from_nvml(NVML_ND_H100_V5)
    assert [g.index for g in eight] == list(range(8)) and eight[0] == H100
    assert gpus_from_nvml(NVML_OLD_T4) == (Gpu(0, "Tesla T4", 16_106_127_360), Gpu(1, "Tesla T4", 16_106_127_360))
    assert gpus_from_nvml([]) == ()


def test_odd_nvml_values_do_not_crash_the_agent() -> None:
    odd = gpus_from_nvml([("  \x00\n", -1), (b"\xff\xfeGPU", float("nan")), ("x" * 999, True)])
    assert [g.name for g in odd] == ["GPU", "\ufffd\ufffdGPU", "x" * 256]
    assert [g.memory_bytes for g in odd] == [0, 0, 0]


def test_torch_probe_output_becomes_gpus() -> None:
    assert gpus_from_torch(TORCH_ON_CPU_BUILD) == ()
    two = gpus_from_torch("/usr/lib/python3/torch/cuda/__init__.py: UserWarning: something\n" + TORCH_ON_TWO_A100)
    assert two == (Gpu(0, "NVIDIA A100-SXM4-40GB", 42298834944), Gpu(1, "NVIDIA A100-SXM4-40GB", 42298834944))


@pytest.mark.parametrize(
    "stdout",
    ["", "not json", "[1, 2]", '{"devices": 3}', '{"devices": [{"name": "x"}, {"index": -1}, {"index": true}]}'],
)
def test_torch_output_that_is_not_the_probe_means_no_gpu(stdout: str) -> None:
    assert gpus_from_torch(stdout) == ()


@pytest.mark.slow
def test_the_torch_probe_runs_here_and_finds_no_gpu() -> None:
    """The probe's script is real Python against the real torch API; a CPU build answers with no devices."""
    stdout = gpu_probe.query_torch(sys.executable, os.environ)
    assert stdout is not None and gpus_from_torch(stdout) == ()


def _fake_python(tmp_path: Path, body: str) -> str:
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_a_torch_probe_that_hangs_fails_or_cannot_start_means_no_gpu(tmp_path: Path) -> None:
    assert gpu_probe.query_torch(_fake_python(tmp_path, "sleep 10"), {}, timeout=0.2) is None
    assert gpu_probe.query_torch(_fake_python(tmp_path, "echo boom >&2; exit 3"), {}) is None
    assert gpu_probe.query_torch(str(tmp_path / "missing-python"), {}) is None


def test_the_torch_probe_lists_in_pci_bus_order(tmp_path: Path) -> None:
    stdout = gpu_probe.query_torch(_fake_python(tmp_path, "echo $CUDA_DEVICE_ORDER"), {})
    assert stdout == "PCI_BUS_ID\n"


class _FakeNvmlError(Exception):
    pass


def _fake_pynvml(devices: list[tuple[object, int]], init_fails: bool = False) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if init_fails:
            raise _FakeNvmlError("Driver Not Loaded")

    module.NVMLError = _FakeNvmlError  # type: ignore[attr-defined]
    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: devices[h][0]  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=devices[h][1])  # type: ignore[attr-defined]
    module.calls = calls  # type: ignore[attr-defined]
    return module


def test_nvml_is_queried_through_pynvml_and_shut_down(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_pynvml([("NVIDIA A100 80GB PCIe", 85_899_345_920)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpu_probe.query_nvml() == NVML_NC_A100_V4
    assert fake.calls == ["init", "shutdown"]
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml([], init_fails=True))
    assert gpu_probe.query_nvml() is None


def test_without_pynvml_nvml_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert gpu_probe.query_nvml() is None


class Probes:
    """Scripted probes that record which ones were asked."""

    def __init__(self, nvml: Sequence[tuple[object, object]] | None, torch: str | None, present: bool) -> None:
        self.answers = (nvml, torch, present)
        self.asked: list[str] = []

    def discover(self, environ: Mapping[str, str]) -> tuple[tuple[Gpu, ...], str]:
        def nvml() -> Sequence[tuple[object, object]] | None:
            self.asked.append("nvml")
            return self.answers[0]

        def torch(python: str, env: Mapping[str, str]) -> str | None:
            self.asked.append("torch")
            return self.answers[1]

        def present() -> bool:
            self.asked.append("present")
            return self.answers[2]

        return gpu_probe.discover("python", environ, nvml=nvml, torch=torch, present=present)


def test_nvml_first_and_no_torch_when_it_answers() -> None:
    probes = Probes(NVML_ND_H100_V5, TORCH_ON_TWO_A100, True)
    gpus, source = probes.discover({})
    assert (len(gpus), source, probes.asked) == (8, "nvml", ["nvml"])


def test_torch_only_where_an_nvidia_device_exists() -> None:
    cpu_host = Probes(None, TORCH_ON_TWO_A100, False)
    assert cpu_host.discover({}) == ((), "none") and cpu_host.asked == ["nvml", "present"]
    no_pynvml = Probes(None, TORCH_ON_TWO_A100, True)
    gpus, source = no_pynvml.discover({})
    assert (len(gpus), source, no_pynvml.asked) == (2, "torch", ["nvml", "present", "torch"])
    failing = Probes(None, None, True)
    assert failing.discover({}) == ((), "none")


def test_a_cuda_visible_devices_mask_is_left_to_torch() -> None:
    """NVML lists every GPU whatever the mask says; torch applies it, as the trainers will."""
    probes = Probes(NVML_ND_H100_V5, TORCH_ON_TWO_A100, True)
    gpus, source = probes.discover({"CUDA_VISIBLE_DEVICES": "2,5"})
    assert (len(gpus), source, probes.asked) == (2, "torch", ["present", "torch"])


def test_nvidia_device_nodes_are_looked_for() -> None:
    assert gpu_probe.nvidia_device_present(lambda path: path == "/dev/nvidiactl")
    assert not gpu_probe.nvidia_device_present(lambda path: False)


def test_slots_follow_the_gpus_unless_asked() -> None:
    eight = gpus_from_nvml(NVML_ND_H100_V5)
    assert parse_slots("auto") is None and parse_slots("3") == 3
    for bad in ("0", "-2", "two", ""):
        with pytest.raises(UserInputError, match="--slots"):
            parse_slots(bad)
    assert slot_count(None, eight) == 8 and slot_count(None, ()) == 1
    assert slot_count(2, eight) == 2 and slot_count(8, eight) == 8 and slot_count(3, ()) == 3


def test_more_slots_than_gpus_is_refused_with_the_fix() -> None:
    """NCCL cannot put two ranks of one communicator on one GPU: slots never share one."""
    two = gpus_from_nvml(NVML_OLD_T4)
    with pytest.raises(UserInputError, match=r"--slots 3: this node trains on 2 GPU.*--slots 2 or fewer.*--gpus none"):
        slot_count(3, two)


def test_slot_i_trains_on_gpu_i() -> None:
    four = gpus_from_nvml(NVML_ND_H100_V5[:4])
    assert [device_for_slot(s, four) for s in range(4)] == [0, 1, 2, 3]
    assert device_for_slot(0, ()) is None


def test_gpus_chosen_by_index_map_slots_onto_those_devices() -> None:
    eight = gpus_from_nvml(NVML_ND_H100_V5)
    chosen = choose(eight, parse_gpu_choice("6,7"))
    assert [g.index for g in chosen] == [6, 7]
    assert [device_for_slot(s, chosen) for s in range(2)] == [6, 7]
    assert choose(eight, parse_gpu_choice("auto")) == eight
    assert parse_gpu_choice("none") == ()
    with pytest.raises(UserInputError, match="no GPU with index 8"):
        choose(eight, (8,))
    for bad in ("x", "1,1", "-1", ""):
        with pytest.raises(UserInputError, match="--gpus"):
            parse_gpu_choice(bad)


def test_trainers_see_cuda_in_pci_bus_order_only_on_gpu_nodes() -> None:
    env = {"PATH": "/bin", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    assert trainer_environment(env, ()) is None  # CPU nodes: the agent's environment as it is
    assert trainer_environment(env, (H100,)) == {"PATH": "/bin", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_a_node_s_gpus_in_a_few_words() -> None:
    assert describe(gpus_from_nvml(NVML_ND_H100_V5[:2])) == "2x H100 80GB HBM3"
    assert describe(gpus_from_nvml(NVML_OLD_T4)) == "2x Tesla T4 15GB"
    assert describe(()) == "-"
    mixed = [("NVIDIA A100 80GB PCIe", 1), ("Tesla T4", 16_106_127_360), ("NVIDIA A100 80GB PCIe", 1)]
    assert describe_gpus(mixed) == "2x A100 80GB PCIe, 1x Tesla T4 15GB"
    assert gpu_label("NVIDIA L4", 24_152_899_584) == "L4 22GB" and gpu_label("", 0) == "GPU"
