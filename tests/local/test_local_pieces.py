"""The local cluster's pieces that need no process: its directory layout, trace scaling, the platform's
eviction step, waiting, and the harness's reading of progress files and failure report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from morphing.errors import UserInputError
from morphing.traces import parse_trace
from spotmorph.local import netns
from spotmorph.local.harness import (
    LocalCluster,
    cluster_env,
    first_event,
    last_step,
    world_size,
)
from spotmorph.local.imds_server import ScheduledEventsState
from spotmorph.local.layout import ClusterDir
from spotmorph.local.platform import evict_started
from spotmorph.local.processes import TimedOut, alive, read_pid, wait_for, wait_gone
from spotmorph.local.provider import LocalProcessProvider
from spotmorph.local.replay import ReplayOptions, load_trace, targets
from worker_agent.contract import (
    CheckpointLoaded,
    ProgressRecord,
    StepCompleted,
    TrainingStopped,
    progress_line,
)


def test_the_cluster_directory_names_every_file(tmp_path: Path) -> None:
    files = ClusterDir.of_home(tmp_path)
    assert files.root == tmp_path / "local"
    named = {
        files.controller_settings: "controller.yaml",
        files.controller_command: "controller.json",
        files.controller_pid: "controller.pid",
        files.controller_log: "controller.log",
        files.platform_pid: "platform.pid",
        files.platform_log: "platform.log",
    }
    assert all(path == files.root / name for path, name in named.items())
    assert files.operator_token == files.root / "state" / "operator.token"
    assert files.node_secret == files.root / "state" / "node-secret"
    assert ClusterDir.of_state_dir(files.state) == ClusterDir(files.root.resolve())
    vm = files.vm(3)
    assert vm.path == files.root / "vms" / "vm-3" and vm.serial == 3 and vm.name == "vm-3"
    assert (vm.pid_file.name, vm.node_name_file.name, vm.command_file.name, vm.log.name) == (
        "agent.pid",
        "node-name",
        "agent.json",
        "agent.log",
    )


def test_vms_come_in_start_order_and_only_written_pid_files_count(tmp_path: Path) -> None:
    files = ClusterDir(tmp_path)
    assert files.vm_dirs() == [] and files.pid_files() == [] and files.logs() == []
    for serial in (10, 2, 1):
        files.vm(serial).path.mkdir(parents=True)
    assert [vm.name for vm in files.vm_dirs()] == ["vm-1", "vm-2", "vm-10"]
    vm = files.vm(2)
    assert files.vm(2).pid is None and files.vm(2).node_name is None
    vm.pid_file.write_text("1234")
    vm.node_name_file.write_text("node-7\n")
    vm.command_file.write_text(json.dumps(["agent", "--slots", "2"]))
    files.controller_log.write_text("")
    assert (vm.pid, vm.node_name, vm.command()) == (1234, "node-7", ["agent", "--slots", "2"])
    assert files.pid_files() == [vm.pid_file]
    assert files.logs() == [files.controller_log]


def test_a_trace_is_scaled_so_that_its_peak_is_max_nodes(tmp_path: Path) -> None:
    trace = parse_trace("0,add,a\n10000,add,b\n20000,add,c\n30000,add,d\n40000,remove,a\n")  # ms
    assert targets(trace, 2) == [(0.0, 0), (10.0, 1), (20.0, 2), (30.0, 2), (40.0, 2)]
    assert [want for _, want in targets(trace, 4)] == [1, 2, 3, 4, 3]
    with pytest.raises(UserInputError, match="--speedup"):
        ReplayOptions(speedup=0).check()
    with pytest.raises(UserInputError, match="--notice"):
        ReplayOptions(notice=-1).check()
    with pytest.raises(UserInputError, match="cannot be read"):
        load_trace(tmp_path / "missing.csv")


def test_the_platform_removes_started_evictions_and_leaves_scheduled_ones(tmp_path: Path) -> None:
    now = [1_800_000_000.0]
    state = ScheduledEventsState(lambda: now[0])
    provider = LocalProcessProvider(tmp_path, "")
    soon = state.schedule("Preempt", ["node-1"], 30)
    later = state.schedule("Preempt", ["node-2"], 300)
    reboot = state.schedule("Reboot", ["node-3"], 0)
    assert evict_started(state, provider) == []  # nothing started but the reboot, which is no eviction
    now[0] += 31
    assert evict_started(state, provider) == []  # node-1 runs nowhere here: nothing to kill
    left = {e["EventId"] for e in state.admin_view()}
    assert soon not in left and {later, reboot} <= left


def test_waiting_quotes_the_log_and_processes_are_read_from_pid_files(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("starting\nerror: port in use\n")
    with pytest.raises(TimedOut, match="the thing to start\nstarting\nerror: port in use"):
        wait_for(lambda: False, 0.05, "the thing to start", log=log, poll=0.01)
    wait_for(lambda: True, 0, "nothing")
    (tmp_path / "bad.pid").write_text("not a pid")
    assert read_pid(tmp_path / "bad.pid") is None and read_pid(tmp_path / "none.pid") is None
    assert alive(os.getpid()) and not alive(None)


def test_the_harness_environment_points_at_its_home_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTMORPH_CONTROLLER", "10.0.0.1:50051")
    monkeypatch.setenv("SPOTMORPH_TOKEN", "someone else's")
    env = cluster_env(tmp_path, {"SPOTMORPH_WARM_TRAINERS": "0"})
    assert env["SPOTMORPH_HOME"] == str(tmp_path) and env["SPOTMORPH_WARM_TRAINERS"] == "0"
    assert "SPOTMORPH_CONTROLLER" not in env and "SPOTMORPH_TOKEN" not in env


def _record(event: object, rank: int = 0, generation: int = 1, at: float = 100.0) -> ProgressRecord:
    return ProgressRecord(event=event, rank=rank, generation=generation, pid=1, time=at)  # type: ignore[arg-type]


def _step(step: int) -> StepCompleted:
    return StepCompleted(step=step, loss=1.0, step_seconds=0.1, samples_per_second=10.0, last_checkpoint=None)


def test_progress_helpers_find_first_events_and_the_last_step() -> None:
    records = [_record(CheckpointLoaded(step=20, checkpoint="c"), at=1.0), _record(_step(21), at=2.0)]
    records.append(_record(TrainingStopped(step=25, last_checkpoint=20, stop_at=3.0, checkpoint_seconds=0.5)))
    assert first_event(records, StepCompleted) == (2.0, _step(21))
    assert first_event(records[:1], StepCompleted) is None
    assert last_step(records) == 25 and last_step([]) == 0
    assert world_size({"layout": {"pipeline_stages": 2, "data_parallel": 3}}) == 6


def test_the_harness_reads_trainer_progress_from_every_vm(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    for serial, ranks in ((1, (0,)), (2, (1,))):
        generation = cluster.files.vm(serial).work_dir.trainers.generation_dir("job-1", 2)
        generation.path.mkdir(parents=True)
        for rank in ranks:
            lines = [progress_line(_record(_step(s), rank=rank, generation=2)) for s in (5, 6)]
            generation.progress_file(rank).write_text("\n".join(lines) + "\n")
    assert set(cluster.progress("job-1", 2)) == {("vm-1", 0), ("vm-2", 1)}
    assert list(cluster.rank_progress("job-1")) == [2] and cluster.rank_progress("job-1", rank=5) == {}
    assert cluster.steps_reported() == 6
    assert cluster.first_step_done("job-1", 2, world=2) and not cluster.first_step_done("job-1", 2, world=3)
    assert not cluster.first_step_done("job-1", 3, world=1)


def test_the_failure_report_names_the_jobs_and_their_seeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = LocalCluster(tmp_path)
    monkeypatch.setattr(cluster, "event_log", lambda: "JobSubmitted job-1")
    cluster.submitted = {"job-1": {"seed": 7, "steps": 300}, "job-2": {"steps": 10}}
    cluster.files.controller_log.parent.mkdir(parents=True)
    cluster.files.controller_log.write_text("x" * 5000 + "the end")
    report = cluster.failure_report()
    assert "===== controller event log =====\nJobSubmitted job-1" in report
    assert "job-1: seed=7 steps=300" in report and "job-2: seed=(the spec default) steps=10" in report
    assert "--- controller.log (tail) ---" in report and report.endswith("the end") and "x" * 1500 not in report


def test_a_vms_command_line_splits_into_its_namespace_and_the_agents_command() -> None:
    agent = ["/usr/bin/python3", "-m", "spotmorph.cli", "agent", "--slots", "1"]
    prefix = ["/usr/sbin/ip", "netns", "exec", "spotmorph-ab12-vm3"]  # what exec_prefix gives where ip is installed
    assert netns.split_exec_prefix([*prefix, *agent]) == ("spotmorph-ab12-vm3", agent)
    assert netns.split_exec_prefix(agent) == (None, agent)
    assert netns.split_exec_prefix(["/sbin/ip", "netns", "exec", "only-a-name"]) == (
        None,
        ["/sbin/ip", "netns", "exec", "only-a-name"],
    )
    assert netns.split_exec_prefix(["ipx", "netns", "exec", "ns", "cmd"])[0] is None


def test_a_killed_process_is_gone_when_wait_gone_returns_child_or_not() -> None:
    """A released VM is gone from the provider's list at once: a SIGKILL is delivered at once, but the process takes
    a moment to die (a list taken in that moment named the released VM once, in a loaded CI run)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(child.pid, signal.SIGKILL)
    wait_gone(child.pid)
    assert not alive(child.pid)
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)  # collected by wait_gone: no zombie left for anyone
    child.returncode = -signal.SIGKILL  # Popen's own bookkeeping, so its finalizer does not wait again
    wait_gone(os.getppid(), timeout=0.05)  # not our child and alive: gives up at its bound, kills nothing
    assert alive(os.getppid())
