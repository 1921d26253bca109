"""``python -m tests.agent.zygote_probe TMP``: a supervisor that forks its warm trainers from a zygote, driven
through what an agent does with them; prints one JSON object of what it saw (tests/agent/test_zygote.py).

It runs as a process of its own because the supervisor makes its process a child subreaper, which a pytest
worker must not become (it would adopt every daemon a later test leaves behind).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from spotmorph.local.processes import port_range_base
from tests.agent.test_prepare import launch as prepared_launch
from tests.runtime.helpers import wait_for
from worker_agent.agent.converge import TrainerKey
from worker_agent.agent.supervisor import LaunchSpec, Supervisor
from worker_agent.agent.zygote import reap_orphans


def launch(tmp: Path) -> LaunchSpec:
    return prepared_launch(tmp, "ckpt", port_range_base(2))


def stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()


def children() -> list[int]:
    """This process's children, live or zombie."""
    own = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if stat(int(entry))[1] == own:
                    found.append(int(entry))
            except (OSError, IndexError):
                pass
    return found


def main(tmp: Path) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    supervisor = Supervisor(tmp / "node", warm=2, zygote=True)
    supervisor.prewarm()
    wait_for(lambda: supervisor.warm_ready() == 2, 120, "two forked warm trainers")
    zygote = supervisor.warm_trainers._zygote
    assert zygote is not None
    warm = [w.process.pid for w in supervisor.warm_trainers.waiting]
    seen["zygote"] = zygote.process.pid
    seen["warm"] = warm
    seen["parents"] = [int(stat(pid)[1]) for pid in warm]
    seen["groups"] = [int(stat(pid)[2]) for pid in warm]
    seen["cmdlines_are_the_zygotes"] = all(
        Path(f"/proc/{pid}/cmdline").read_bytes() == Path(f"/proc/{zygote.process.pid}/cmdline").read_bytes()
        for pid in warm
    )
    key = TrainerKey("job-1", 1, 0)
    supervisor.start(key, launch(tmp))
    wait_for(lambda: not any(r.status.running for r in supervisor.reports()), 120, "the forked trainer to finish")
    (report,) = supervisor.reports()
    seen["trainer"] = {"pid": report.pid, "exit": report.status.exit_code, "step": report.step}
    (left,) = [w.process for w in supervisor.warm_trainers.waiting]
    os.kill(left.pid, signal.SIGKILL)  # a warm trainer dies unused: its exit is seen as a child's
    wait_for(lambda: left.poll() is not None, 30, "the killed warm trainer's exit")
    seen["killed_exit"] = left.poll()
    supervisor.prewarm()
    wait_for(lambda: supervisor.warm_ready() == 2, 60, "the two replacements")
    seen["replaced"] = [w.process.pid for w in supervisor.warm_trainers.waiting]
    orphan_parent = subprocess.Popen([sys.executable, "-c", "import os, time\nif os.fork() == 0: time.sleep(0.2)"])
    orphan_parent.wait()
    time.sleep(0.5)  # the orphan (adopted by this process, a subreaper) has exited: a zombie nobody waits for
    before = len(children())
    reap_orphans({w.process.pid for w in supervisor.warm_trainers.waiting} | {zygote.process.pid})
    seen["orphans_reaped"] = before - len(children())
    started = time.monotonic()
    supervisor.kill_all()
    seen["kill_all_seconds"] = time.monotonic() - started
    seen["children_left"] = [pid for pid in children() if stat(pid)[0] != "Z"]
    supervisor.prewarm()  # an agent that registers anew kills all, then keeps warm trainers again
    wait_for(lambda: supervisor.warm_ready() == 2, 120, "warm trainers after kill_all")
    again = supervisor.warm_trainers._zygote
    seen["zygote_after_kill_all"] = again.process.pid if again is not None else 0
    supervisor.kill_all()
    pending = Supervisor(tmp / "pending", warm=2, zygote=True)
    pending.prewarm()  # the zygote is still importing: both warm trainers are only asked for
    seen["pending_pids"] = [w.process.pid for w in pending.warm_trainers.waiting]
    pending.start(key, launch(tmp))  # handed to a warm trainer not forked yet: it trains once it is
    pid_file = pending.generation_dir("job-1", 1).pid_file(0)
    seen["pid_file_at_start"] = pid_file.exists()
    wait_for(lambda: not any(r.status.running for r in pending.reports()), 120, "the pending trainer to finish")
    (report,) = pending.reports()
    seen["pending_trainer"] = {"pid": report.pid, "exit": report.status.exit_code, "step": report.step}
    seen["pending_pid_file"] = int(pid_file.read_text()) if pid_file.exists() else 0
    pending.kill_all()
    seen["pending_children_left"] = [pid for pid in children() if stat(pid)[0] != "Z"]
    doomed = Supervisor(tmp / "doomed", warm=1, zygote=True)
    doomed.prewarm()
    doomed.start(key, launch(tmp))  # handed to a warm trainer not forked yet, then killed (an abort came)
    doomed.kill(key)  # returns without waiting for the zygote: the agent's loop (its heartbeats) goes on
    seen["pid_when_kill_returned"] = doomed.reports()[0].pid
    wait_for(lambda: not any(r.status.running for r in doomed.reports()), 120, "the killed trainer to be reaped")
    (report,) = doomed.reports()
    seen["doomed_trainer"] = {"pid": report.pid, "exit": report.status.exit_code}
    doomed.kill_all()
    seen["doomed_children_left"] = [pid for pid in children() if stat(pid)[0] != "Z"]
    return seen


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
