"""The systemd units parse and verify (with the installed command standing in for /opt/spotmorph)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = sorted((Path(__file__).resolve().parents[2] / "deploy" / "systemd").glob("*.service"))
INSTALLED = "/opt/spotmorph/.venv/bin/spotmorph"


SPOTMORPH_UNITS = [u for u in UNITS if u.name != "spotmorph-postgresql.service"]


def test_units_exist_and_run_as_a_non_root_user() -> None:
    assert {u.name for u in UNITS} == {
        "spotmorph-agent.service",
        "spotmorph-controller.service",
        "spotmorph-controller-ha.service",
        "spotmorph-postgresql.service",
    }
    for unit in SPOTMORPH_UNITS:
        text = unit.read_text()
        assert "User=spotmorph" in text
        assert "Restart=always" in text
        assert INSTALLED in text
    assert "User=postgres" in (UNITS[0].parent / "spotmorph-postgresql.service").read_text()


def test_the_ha_controller_takes_its_database_and_address_from_its_node_and_starts_after_the_database() -> None:
    unit = UNITS[0].parent / "spotmorph-controller-ha.service"
    settings = _settings(unit)
    assert dict(settings)["EnvironmentFile"] == "/etc/spotmorph/controller-ha.env"
    text = unit.read_text()
    assert "SPOTMORPH_CONTROLLER_DATABASE=postgresql://" in text and "SPOTMORPH_CONTROLLER_ADVERTISE=" in text
    assert "spotmorph-postgresql.service" in dict(settings)["After"]
    assert "--listen 0.0.0.0:50051" in dict(settings)["ExecStart"]


def test_the_database_unit_keeps_commits_durable() -> None:
    text = (UNITS[0].parent / "spotmorph-postgresql.service").read_text()
    assert "fsync=off" not in text and "synchronous_commit=off" not in text
    assert "scram-sha-256" in text


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_systemd_analyze_verify(unit: Path, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    command = Path(sys.executable).with_name("spotmorph")
    local = tmp_path / unit.name
    local.write_text(unit.read_text().replace(INSTALLED, str(command)))
    result = subprocess.run([analyze, "verify", str(local)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if unit.name in line]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr


def _settings(unit: Path) -> list[tuple[str, str]]:
    """``Key=value`` lines of a unit, continuation lines joined (keys may repeat, as Environment= does)."""
    joined = unit.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in joined.splitlines()]
    return [tuple(line.split("=", 1)) for line in lines if "=" in line and not line.startswith("#")]  # type: ignore[misc]


def test_the_agent_gives_nccl_and_gloo_the_ethernet_nic_and_no_infiniband() -> None:
    unit = next(u for u in UNITS if u.name == "spotmorph-agent.service")
    settings = _settings(unit)
    environment = [value for key, value in settings if key == "Environment"]
    assert {"NCCL_SOCKET_IFNAME=eth0", "GLOO_SOCKET_IFNAME=eth0", "NCCL_IB_DISABLE=1"} <= set(environment)
    keys = [key for key, _ in settings]
    assert keys.index("EnvironmentFile") > max(i for i, k in enumerate(keys) if k == "Environment")  # it may override
    after = " ".join(value for key, value in settings if key == "After")
    assert "nvidia-persistenced.service" in after  # GPUs are discovered once, at start
    exec_start = dict(settings)["ExecStart"]
    assert "--slots ${SPOTMORPH_SLOTS}" in exec_start


def test_the_controller_has_room_for_its_descriptors() -> None:
    unit = next(u for u in UNITS if u.name == "spotmorph-controller.service")
    assert int(dict(_settings(unit))["LimitNOFILE"]) >= 65536
