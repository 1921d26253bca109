"""``spotmorph profile`` says what it is measuring while it runs (stderr, so stdout stays its result), and its
``--help`` names every default."""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path
from typing import Any

import pytest

from spotmorph.cli import build_parser, main
from tests.runtime.helpers import TINY
from worker_agent.runtime.profiling import layer_timing
from worker_agent.runtime.profiling.profile_progress import Progress, duration
from worker_agent.runtime.profiling.profiler import ProfileRequest, build_profile


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Flushed(io.StringIO):
    """Counts flushes: a line buffered in a pipe for 900 s is a line nobody saw."""

    flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def test_each_line_names_the_layer_the_size_and_the_time_left() -> None:
    clock, out = Clock(), Flushed()
    progress = Progress(2, (1, 3), out, clock, every=0.0)  # the work: 2 layers x (1 + 3) samples = 8
    progress.measuring(0, "embed", 1)
    clock.now += 10.0  # 10 s for 1 of 8 units
    progress.measuring(1, "head", 1)
    clock.now += 10.0
    progress.measuring(0, "embed", 3)  # 2 of 8 done in 20 s: 6 left at 10 s each
    lines = out.getvalue().splitlines()
    assert lines == [
        "spotmorph profile: layer 1 of 2 (embed), micro-batch 1: estimating the time left",
        "spotmorph profile: layer 2 of 2 (head), micro-batch 1: about 1 min 10 s left",
        "spotmorph profile: layer 1 of 2 (embed), micro-batch 3: about 1 min 0 s left",
    ]
    assert out.flushes >= len(lines)


def test_lines_come_at_most_every_few_seconds_but_phases_always() -> None:
    clock, out = Clock(), io.StringIO()
    progress = Progress(10, (1,), out, clock, every=2.0)
    for i in range(10):
        progress.measuring(i, f"block{i}", 1)
        clock.now += 0.5
    progress.phase("the network")
    lines = out.getvalue().splitlines()
    assert [line.split(":")[1].strip() for line in lines] == [
        "layer 1 of 10 (block0), micro-batch 1",
        "layer 5 of 10 (block4), micro-batch 1",
        "layer 9 of 10 (block8), micro-batch 1",
        "the network",
    ]


def test_silent_without_an_output() -> None:
    Progress(1, (1,)).measuring(0, "only", 1)  # a library caller's default: nothing printed, nothing raised


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0 s"), (59, "59 s"), (190, "3 min 10 s"), (7500, "2 h 5 min")])
def test_durations_read_as_people_read_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_the_first_line_comes_before_the_first_layer_is_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large model's first timing takes minutes: the user must already know what is being measured."""
    out = io.StringIO()
    seen: list[str] = []
    timed = layer_timing.Where.median_seconds

    def spy(self: layer_timing.Where, fn: Any, repeats: int) -> float:
        seen.append(out.getvalue())
        return timed(self, fn, repeats)

    monkeypatch.setattr(layer_timing.Where, "median_seconds", spy)
    for from_config in (False, True):
        seen.clear()
        build_profile(ProfileRequest(TINY, (1,), repeats=1, network=False, from_config=from_config), report=out)
        assert "layer 1 of 4 (embed), micro-batch 1" in seen[0], (from_config, seen[0])


@pytest.mark.parametrize("extra", [[], ["--from-config"]])
def test_the_command_reports_on_stderr_and_keeps_stdout_its_result(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str]
) -> None:
    out = tmp_path / "p.json"
    flags = ["--micro-batch-sizes=1,2", "--repeats=1", "--no-network", f"--out={out}", *extra]
    assert main(["profile", TINY, *flags]) == 0
    stdout, stderr = capsys.readouterr()
    assert stdout == f"wrote {out}\n"
    assert stderr.startswith("spotmorph profile: layer 1 of 4 (embed), micro-batch 1: estimating the time left\n")
    assert "spotmorph profile: measured in " in stderr and "Traceback" not in stderr


def _profile_parser() -> argparse.ArgumentParser:
    for action in build_parser()[0]._actions:
        if isinstance(action, argparse._SubParsersAction):
            parser: argparse.ArgumentParser = action.choices["profile"]
            return parser
    raise AssertionError("no subcommands")


def test_help_names_every_default() -> None:
    parser = _profile_parser()
    text = io.StringIO()
    with contextlib.redirect_stdout(text), pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    help_text = " ".join(text.getvalue().split())  # argparse wraps lines where it likes
    with_defaults = [
        a
        for a in parser._actions
        if a.default not in (None, argparse.SUPPRESS) and not isinstance(a.default, bool) and a.option_strings
    ]
    assert {a.dest for a in with_defaults} >= {"micro_batch_sizes", "dtype", "precision", "device", "seed", "repeats"}
    for action in with_defaults:
        shown = f"{action.help} (default: {action.default})"
        assert " ".join(shown.split()) in help_text, action.dest
    assert "(default: None)" not in help_text and "(default: False)" not in help_text
