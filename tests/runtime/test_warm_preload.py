"""A warm trainer imports the model libraries the runtime supports ahead, when installed, and never fails for one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def preload(libraries: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; from worker_agent.runtime import warm; "
        f"warm.MODEL_LIBRARIES = {libraries!r}; warm._preload(); "
        "print(sorted(m for m in sys.modules if m in ('transformers.modeling_utils', 'json.decoder')))"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_the_hugging_face_library_is_imported_before_any_assignment() -> None:
    from worker_agent.runtime.warm import MODEL_LIBRARIES

    done = preload(MODEL_LIBRARIES)
    assert done.returncode == 0, done.stderr
    assert "transformers.modeling_utils" in done.stdout, done.stdout


def test_a_library_not_installed_is_skipped_and_a_broken_one_only_warned_about() -> None:
    done = preload(("no_such_package_for_spotmorph.models", "json.no_such_module", "json.decoder"))
    assert done.returncode == 0, done.stderr
    assert "json.decoder" in done.stdout  # the ones after a failure are still imported
    assert "cannot import json.no_such_module ahead" in done.stderr
    assert "no_such_package_for_spotmorph" not in done.stderr
