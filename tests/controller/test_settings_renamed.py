"""Settings renamed in this release are still read under their old names, once more, with a warning in the log.

"Hold" means training state kept in memory (docs/DESIGN.md, Glossary), so a flapping node's wait in JOINING is a
quarantine: ``rejoin_hold_seconds`` and ``rejoin_hold_max_seconds`` became ``rejoin_quarantine_*``. A config
file or environment of the release before must not stop the controller, nor be ignored in silence.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from controller.app.daemon import reconcile_config
from controller.app.settings import RENAMED_SETTINGS, ControllerSettings, load_settings
from controller.core.flapping import Damping
from morphing.errors import UserInputError

LOGGER = "controller.app.settings"


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "controller.yaml"
    path.write_text(text)
    return path


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_the_old_names_in_a_config_file_are_read_as_the_new_ones_with_a_deprecation_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = config(tmp_path, "rejoin_hold_seconds: 7\nrejoin_hold_max_seconds: 70\n")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        settings = load_settings(path, {})
    assert (settings.rejoin_quarantine_seconds, settings.rejoin_quarantine_max_seconds) == (7.0, 70.0)
    assert reconcile_config(settings).damping == Damping(7.0, 70.0, settings.flap_memory_seconds)
    said = warnings(caplog)
    assert len(said) == 2, said
    assert all("deprecated" in w and f"--config {path}" in w and "next release" in w for w in said), said
    assert "rejoin_hold_seconds" in said[0] and "rename it rejoin_quarantine_seconds" in said[0], said


def test_an_old_environment_variable_is_read_and_named_in_the_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SPOTMORPH_CONTROLLER_REJOIN_HOLD_MAX_SECONDS", "90")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        settings = load_settings(None, {})
    assert settings.rejoin_quarantine_max_seconds == 90.0
    [said] = warnings(caplog)
    assert "SPOTMORPH_CONTROLLER_REJOIN_HOLD_MAX_SECONDS" in said
    assert "SPOTMORPH_CONTROLLER_REJOIN_QUARANTINE_MAX_SECONDS" in said


def test_the_new_name_wins_over_the_old_and_the_old_is_said_to_be_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = config(tmp_path, "rejoin_hold_seconds: 7\nrejoin_quarantine_seconds: 3\n")
    monkeypatch.setenv("SPOTMORPH_CONTROLLER_REJOIN_HOLD_SECONDS", "11")  # the environment wins over the file
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        settings = load_settings(path, {})
    assert settings.rejoin_quarantine_seconds == 11.0
    said = warnings(caplog)
    assert any("ignored" in w and "rejoin_hold_seconds" in w for w in said), said
    monkeypatch.setenv("SPOTMORPH_CONTROLLER_REJOIN_QUARANTINE_SECONDS", "5")
    assert load_settings(path, {}).rejoin_quarantine_seconds == 5.0


def test_no_warning_without_old_names_and_other_unknown_settings_are_still_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        settings = load_settings(config(tmp_path, "rejoin_quarantine_seconds: 4\n"), {})
    assert settings.rejoin_quarantine_seconds == 4.0 and not warnings(caplog)
    with pytest.raises(UserInputError, match="rejoin_hold_secs"):
        load_settings(config(tmp_path, "rejoin_hold_secs: 4\n"), {})
    assert set(RENAMED_SETTINGS.values()) <= set(ControllerSettings.model_fields)
    assert not set(RENAMED_SETTINGS) & set(ControllerSettings.model_fields)
