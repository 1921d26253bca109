"""A local cluster's ``spotmorph`` daemons forked from the process that starts them (spotmorph/local/daemons.py):
a controller serves in a session of its own, output in its log, and a kill of its group ends it; a command's exit
code is an interpreter's; anything but this Python's ``-m spotmorph.cli`` spawns a new interpreter."""

from __future__ import annotations

import json
from pathlib import Path

from tests import forkserver_client

PROBE = """
import json, os, signal, sys, time
from pathlib import Path
from spotmorph.local import daemons
log, state = Path(sys.argv[1]), sys.argv[2]
cli = [sys.executable, "-m", "spotmorph.cli"]
seen = {"forkable": daemons.forkable(cli), "other": daemons.forkable([sys.executable, "-m", "json.tool"])}
pid = daemons.start([*cli, "nodes", "--no-such-flag"], log)
seen["failed"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
pid = daemons.start([*cli, "controller", "--state-dir", state, "--listen", "127.0.0.1:0"], log)
deadline = time.monotonic() + 60
while "listening on" not in log.read_text() and time.monotonic() < deadline:
    time.sleep(0.05)
seen["session"] = os.getsid(pid) == pid == os.getpgid(pid)
seen["served"] = "listening on" in log.read_text()
os.killpg(pid, signal.SIGKILL)
seen["killed"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(seen))
"""


def test_a_cli_daemon_is_forked_into_a_session_of_its_own_with_its_output_in_its_log(tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    code, out, err = forkserver_client.run(["-c", PROBE, str(log), str(tmp_path / "state")], tmp_path, 120)
    assert code == 0, err
    seen = json.loads(out)
    assert seen["forkable"] and not seen["other"], "only this Python's -m spotmorph.cli, from one thread"
    assert seen["failed"] == 2 and "--no-such-flag" in log.read_text(), "argparse's exit code, its stderr in the log"
    assert seen["session"] and seen["served"], log.read_text()[-2000:]
    assert seen["killed"] == -9
