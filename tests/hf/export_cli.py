"""`spotmorph checkpoint export` run in this process, for the export tests: bad input is one line and exit 2."""

from __future__ import annotations

import pytest

from spotmorph.cli import main


def export_fails(args: list[str], capsys: pytest.CaptureFixture[str], *words: str) -> None:
    """``checkpoint export ARGS`` exits 2 with one line on stderr holding every one of ``words``."""
    assert main(["checkpoint", "export", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for word in words:
        assert word in err, err
