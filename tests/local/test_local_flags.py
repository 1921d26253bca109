"""The numeric flags of ``spotmorph local`` verbs: NaN, infinities and values ``tc`` cannot take exit 2 naming the flag.

Before, ``spotmorph local netem NODE --rate 1e-300`` was a traceback (tc refused ``1e-300mbit``) and
``--notice nan`` went to the platform as a JSON body no service reads. The numbers are checked before
the verb looks for a cluster, so these run with none up.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from spotmorph.local.network import check_shaping, netem_args, tbf_args
from tests.runtime.helpers import run

# (the verb's arguments, the flag the one line must name)
BAD = {
    "rate far below a kbit/s": (["netem", "node-1", "--rate", "1e-300"], "--rate 1e-300"),
    "rate NaN": (["netem", "node-1", "--rate", "nan"], "--rate nan"),
    "delay infinite": (["netem", "node-1", "--delay", "inf"], "--delay inf"),
    "delay below a microsecond": (["netem", "node-1", "--delay", "1e-9"], "--delay 1e-09"),
    "loss NaN": (["netem", "node-1", "--loss", "nan"], "--loss nan"),
    "notice NaN": (["preempt", "node-1", "--notice", "nan"], "--notice nan"),
    "notice infinite": (["preempt", "node-1", "--notice", "inf"], "--notice inf"),
    "replay speedup NaN": (["replay", "trace.csv", "--speedup", "nan"], "--speedup nan"),
    "replay notice negative": (["replay", "trace.csv", "--notice", "-1"], "--notice -1"),
    "up heartbeat expiry NaN": (["up", "--heartbeat-expiry", "nan"], "--heartbeat-expiry nan"),
    "up debounce infinite": (["up", "--debounce", "inf"], "--debounce inf"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_number_exits_2_with_one_line_naming_the_flag(case: str, tmp_path: Path) -> None:
    args, named = BAD[case]
    env = {**os.environ, "SPOTMORPH_HOME": str(tmp_path)}
    command = [sys.executable, "-m", "spotmorph.cli", "local", *args]
    done = run(command, timeout=60, env=env)
    assert done.returncode == 2, f"exit {done.returncode}:\n{done.stdout}{done.stderr}"
    [line] = done.stderr.strip().splitlines()
    assert named in line and "give" in line, line
    assert not (tmp_path / "local").exists(), "a refused verb started something"


def test_the_smallest_shaping_accepted_is_written_without_an_exponent() -> None:
    check_shaping(0.001, 0.0001, 0.001)
    assert netem_args(0.001, 0.0001, 0.001) == ["netem", "delay", "0.001ms", "loss", "0.0001%", "rate", "0.001mbit"]
    assert tbf_args(100_000)[2] == "100000mbit"
