"""A real local cluster per test: controller, IMDS platform and agent processes on loopback.

When a test fails, the controller's event log (and the tail of every log) is printed, so a red run
says why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from worker_agent.contract import AgentWorkDir

REPO = Path(__file__).resolve().parents[2]
DEMO = f"{REPO}/examples/tiny_gpt.py:build"


class LocalCluster:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {**os.environ, "SPOTMORPH_HOME": str(home)}
        self.env.pop("SPOTMORPH_CONTROLLER", None)
        self.env.pop("SPOTMORPH_TOKEN", None)

    @property
    def cluster(self) -> Path:
        return self.home / "local"

    def cli(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [sys.executable, "-m", "spotmorph.cli", *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=REPO,
            timeout=timeout,
        )
        if check and out.returncode != 0:
            raise AssertionError(f"spotmorph {' '.join(args)} exited {out.returncode}\n{out.stdout}\n{out.stderr}")
        return out

    def up(self, nodes: int, slots: int = 2) -> None:
        self.cli("local", "up", "--nodes", str(nodes), "--slots", str(slots), "--heartbeat-expiry", "5")

    def submit(self, **sets: object) -> str:
        args = ["submit", str(REPO / "examples" / "tiny_gpt.yaml"), "--json"]
        for key, value in sets.items():
            args += ["--set", f"{key}={value}"]
        return str(json.loads(self.cli(*args).stdout)["id"])

    def status(self, job: str) -> dict[str, Any]:
        return dict(json.loads(self.cli("status", job, "--json").stdout))

    def nodes(self) -> list[dict[str, Any]]:
        return list(json.loads(self.cli("nodes", "--json").stdout))

    def events(self) -> str:
        out = self.cli("events", check=False)
        return out.stdout + out.stderr

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.3)

    def wait_state(self, job: str, states: set[str], timeout: float) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def reached() -> bool:
            found.update(self.status(job))
            return found["state"] in states

        self.wait(reached, timeout, f"job {job} to reach {sorted(states)}")
        return found

    def wait_step(self, job: str, step: int, timeout: float) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def reached() -> bool:
            found.update(self.status(job))
            return int(found["step"]) >= step or found["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"}

        self.wait(reached, timeout, f"job {job} to reach step {step}")
        assert found["state"] not in {"FAILED", "CANCELLED"}, found
        return found

    def vms(self) -> list[Path]:
        """Every VM's folder, which is its agent's work dir."""
        return sorted((self.cluster / "vms").glob("*"))

    def vm_of(self, node: str) -> Path:
        for vm in self.vms():
            name = AgentWorkDir(vm).node_name_file
            if name.exists() and name.read_text().strip() == node:
                return vm
        raise AssertionError(f"no VM runs {node}")

    def controller_pid(self) -> int:
        return int((self.cluster / "controller.pid").read_text())

    def kill_controller(self) -> None:
        pid = self.controller_pid()
        os.kill(pid, signal.SIGKILL)

    def start_controller(self) -> None:
        args = json.loads((self.cluster / "controller.json").read_text())
        with open(self.cluster / "controller.log", "ab") as log:
            process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        (self.cluster / "controller.pid").write_text(str(process.pid))
        self.wait(lambda: self.cli("jobs", check=False).returncode == 0, 60, "the controller to serve again")

    def logs(self) -> str:
        parts = []
        for path in sorted(self.cluster.rglob("*.log")):
            text = path.read_text(errors="replace")
            parts.append(f"--- {path.relative_to(self.cluster)} (tail) ---\n{text[-1500:]}")
        return "\n".join(parts)

    def down(self) -> None:
        self.cli("local", "down", check=False)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))


def reference(tmp_dir: Path, steps: int, global_batch: int, seed: int) -> Path:
    """The uninterrupted single-process run the elastic one must equal (float64)."""
    out = tmp_dir / f"reference-{steps}-{global_batch}-{seed}"
    if not (out / "done").exists():
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "spotmorph.cli",
                "train",
                DEMO,
                "--stages=1",
                "--replicas=1",
                f"--global-batch={global_batch}",
                f"--steps={steps}",
                "--dtype=float64",
                f"--seed={seed}",
                f"--checkpoint-dir={out}",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr
        (out / "done").write_text("")
    return out


def max_rel_diff(cluster: LocalCluster, a: Path, b: Path) -> float:
    out = cluster.cli("checkpoint", "diff", str(a), str(b), "--json")
    data = json.loads(out.stdout)
    assert not data["missing"], data
    assert data["step_a"] == data["step_b"], data
    return float(data["max_rel"])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call":
        item.stash[FAILED] = report.failed


FAILED = pytest.StashKey[bool]()


@pytest.fixture(scope="session")
def references(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("references")


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path / "home")
    try:
        yield local
    finally:
        if request.node.stash.get(FAILED, False):
            print("\n===== controller event log =====\n" + local.events())
            print("\n===== logs =====\n" + local.logs())
        local.down()
