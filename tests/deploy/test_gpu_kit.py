"""The GPU kit cannot drift from the project: bench/gpu-kit.txt pins versions pyproject accepts, covers every
runtime need the GPU image lacks, and bench/gpu_check.sh reports every part even when some fail.

The kit itself ran on an H100 (Python 3.12, torch 2.11: docs/benchmarks.md, "GPU check"); here the check
runs on the CPU, where the kit's cp312 wheels do not install and there is no CUDA: both parts must fail,
say why, and leave the others to run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "bench" / "gpu-kit.txt"
# What the GPU image already holds that the project needs (KINDS.md of the device tool, 2026-11-17),
# and what the check never imports: the Azure SDK (only `provider: azure`, controller/app/providers.py) and
# grpcio-tools (only protos/generate.py, which regenerates the checked-in stubs).
IMAGE = {"torch", "numpy", "pyyaml", "aiohttp", "prometheus-client", "transformers", "safetensors", "tokenizers"}
# Imported only where the GPU check never goes: a cloud's provider (azure, aws, gcp), a PostgreSQL store (psycopg,
# under SQLAlchemy, for --database), protobuf code generation.
LAZY = {
    "azure-mgmt-compute",
    "azure-identity",
    "azure-core",
    "grpcio-tools",
    "boto3",
    "google-cloud-compute",
    "grpcio-status",
    "psycopg",
}


def kit() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in KIT.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{line}: the kit pins one version of each wheel"
            assert canonicalize_name(name) not in pins, f"{name} twice"
            pins[canonicalize_name(name)] = version
    return pins


def test_the_kit_pins_versions_the_project_accepts_and_never_torch_or_cuda() -> None:
    """Each pin satisfies pyproject's requirement (grpcio's exact pin, pydantic's range, ...), so the GPU
    machine runs what the project declares; not the versions pip happened to pick here."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared: dict[str, SpecifierSet] = {
        canonicalize_name(Requirement(r).name): Requirement(r).specifier for r in project
    }
    for name, version in kit().items():
        assert not name.startswith(("torch", "nvidia", "triton")), name
        if name in declared:
            assert declared[name].contains(version), (
                f"bench/gpu-kit.txt pins {name}=={version}; pyproject: {declared[name]}"
            )


def test_the_kit_covers_every_runtime_need_the_gpu_image_lacks() -> None:
    pins = kit()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = {canonicalize_name(Requirement(r).name) for r in project} - IMAGE - LAZY
    assert wanted <= set(pins), f"add to bench/gpu-kit.txt: {sorted(wanted - set(pins))}"
    for name in pins:  # and what the kit's own wheels need, on Linux with CPython 3.12
        for spec in metadata.requires(name) or []:
            requirement = Requirement(spec)
            env = {"python_version": "3.12", "platform_machine": "x86_64", "sys_platform": "linux", "extra": ""}
            if requirement.marker is None or requirement.marker.evaluate(env):
                needed = canonicalize_name(requirement.name)
                assert needed in pins or needed in IMAGE, f"{name} needs {needed}: add it to bench/gpu-kit.txt"


@pytest.mark.soak  # make soak: 25 s of the GPU check's scripts on the CPU; make test checks the kit's pins and parts
def test_the_gpu_check_reports_every_part_when_some_fail(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_KIT_SITE": str(tmp_path / "site"), "GPU_CHECK_WORKERS": "1"}
    result = subprocess.run(
        ["bash", "bench/gpu_check.sh", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 1, result.stdout + result.stderr
    report = (out / "gpu-check.md").read_text()
    assert "| kit | failed (exit 1) |" in report, report  # cp312 wheels here, or none: either way not installed
    assert "| environment | failed (exit 1) |" in report and "no CUDA device: the GPU check needs one" in report
    assert "| tests | passed |" in report and "| bench | passed |" in report, report
    assert "skipped" in (out / "tests.log").read_text() and "spotmorph imports: ok" in report
