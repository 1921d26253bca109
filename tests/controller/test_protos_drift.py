"""The checked-in stubs are exactly what ``make protos`` generates from the .proto sources."""

from __future__ import annotations

from pathlib import Path

from protos.generate import SOURCES, generate


def test_stubs_match_sources(tmp_path: Path) -> None:
    generated = generate(tmp_path)
    assert generated, "no stubs generated"
    for path in generated:
        checked_in = SOURCES / path.name
        assert checked_in.exists(), f"{checked_in} missing: run `make protos`"
        assert checked_in.read_text() == path.read_text(), f"{checked_in.name} drifted: run `make protos`"
