"""A warm trainer imports the model libraries the runtime supports ahead, when installed, and never fails for one;
the node's operator names others, or none, in ``SPOTMORPH_WARM_IMPORTS``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from worker_agent.runtime.process.warm import IMPORTS_ENV, MODEL_LIBRARIES, ahead_imports

REPO = Path(__file__).resolve().parents[2]
SEEN = ("transformers.modeling_utils", "json.decoder")


def preload(imports: str | None) -> subprocess.CompletedProcess[str]:
    """A new interpreter's ahead imports with ``SPOTMORPH_WARM_IMPORTS`` set to ``imports`` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != IMPORTS_ENV}
    if imports is not None:
        env[IMPORTS_ENV] = imports
    code = (
        "import sys; from worker_agent.runtime.process import warm; warm._preload(); "
        f"print(sorted(m for m in sys.modules if m in {SEEN!r}))"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_hugging_face_library_is_imported_before_any_assignment() -> None:
    done = preload(None)
    assert done.returncode == 0, done.stderr
    assert "transformers.modeling_utils" in done.stdout, done.stdout


@pytest.mark.slow
def test_an_empty_setting_imports_no_model_library() -> None:
    none = preload(" , ")
    assert none.returncode == 0, none.stderr
    assert "transformers" not in none.stdout, none.stdout


@pytest.mark.slow
def test_a_library_not_installed_is_skipped_and_a_broken_one_only_warned_about() -> None:
    done = preload("no_such_package_for_spotmorph.models, json.no_such_module,json.decoder")
    assert done.returncode == 0, done.stderr
    assert "json.decoder" in done.stdout  # the ones after a failure are still imported
    assert "cannot import json.no_such_module ahead" in done.stderr
    assert "no_such_package_for_spotmorph" not in done.stderr


@pytest.mark.parametrize("bad", ["..json", "json.", "os; import sys", "a b", "\x00", "-m"])
def test_a_name_that_is_no_module_is_left_out_with_a_warning_saying_how_to_write_one(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ahead_imports({IMPORTS_ENV: f"{bad},json.decoder"}) == ("json.decoder",)
    err = capsys.readouterr().err
    assert IMPORTS_ENV in err and "is no module name" in err and "dotted names, comma-separated" in err, err


def test_unset_means_the_model_libraries() -> None:
    assert ahead_imports({}) == MODEL_LIBRARIES
    assert ahead_imports({IMPORTS_ENV: " , "}) == ()
