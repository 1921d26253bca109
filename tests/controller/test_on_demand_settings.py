"""The on-demand price, the scheduler's deadline times and its sharing times reach the controller's decisions from a
flag, the environment or the config file; a bad price is refused naming the flag (exit 2)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from controller.app.commands import controller as command
from controller.app.daemon import reconcile_config
from controller.app.settings import load_settings
from morphing.errors import UserInputError


def parsed(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(flags))


def test_the_price_flag_reaches_the_decisions_and_the_scheduler_section_its_times(tmp_path: Path) -> None:
    args = parsed("--on-demand-gpu-hour-price", "4.5")
    assert args.on_demand_gpu_hour_price == 4.5
    config_file = tmp_path / "c.yaml"
    config_file.write_text(
        "on_demand_gpu_hour_price: 2.0\nscheduler: {safety_seconds: 5, outlook_step_seconds: 10,"
        " starvation_seconds: 60, aging_seconds: 30, min_run_seconds: 20, horizon_seconds: 900}\n"
    )
    config = reconcile_config(load_settings(config_file, {"on_demand_gpu_hour_price": args.on_demand_gpu_hour_price}))
    assert config.on_demand_gpu_hour_price == 4.5  # the flag wins over the file
    deadlines = config.scheduler.deadlines
    assert (deadlines.safety_seconds, deadlines.outlook_step_seconds, deadlines.on_demand_start_seconds) == (5, 10, 120)
    share = config.scheduler.share
    assert (share.aging_seconds, share.starvation_seconds, share.min_run_seconds, share.horizon_seconds) == (
        30,
        60,
        20,
        900,
    )
    assert reconcile_config(load_settings(config_file, {})).on_demand_gpu_hour_price == 2.0
    assert reconcile_config(load_settings(None, {})).on_demand_gpu_hour_price == 3.0


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "three"])
def test_a_bad_price_flag_is_refused_naming_it(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parsed(f"--on-demand-gpu-hour-price={bad}")
    assert exited.value.code == 2
    assert "--on-demand-gpu-hour-price" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("on_demand_gpu_hour_price: 0", "on_demand_gpu_hour_price"),
        ("on_demand_gpu_hour_price: .nan", "on_demand_gpu_hour_price"),
        ("scheduler: {safety_seconds: -1}", "scheduler.safety_seconds"),
        ("scheduler: {outlook_step_seconds: 0}", "scheduler.outlook_step_seconds"),
        ("scheduler: {starvation_seconds: 0}", "scheduler.starvation_seconds"),
        ("scheduler: {aging_seconds: .inf}", "scheduler.aging_seconds"),
        ("scheduler: {margin: 0.1}", "scheduler.margin"),  # not a setting: the tuned margins stay the package's
    ],
)
def test_bad_settings_in_the_file_are_refused_naming_them(tmp_path: Path, text: str, named: str) -> None:
    config_file = tmp_path / "c.yaml"
    config_file.write_text(text + "\n")
    with pytest.raises(UserInputError, match=named):
        load_settings(config_file, {})
