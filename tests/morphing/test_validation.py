"""The edge validators: what they accept is what the controller can use; what they refuse names the field."""

from __future__ import annotations

import ipaddress
import math
import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from morphing.validation import (
    LATEST_TIME,
    MAX_NAME_LENGTH,
    STORABLE_INT,
    InvalidField,
    check_absolute_path,
    check_address,
    check_count,
    check_entrypoint,
    check_name,
    check_step,
    check_text,
    check_time,
    entrypoint_file,
    printable,
    shown,
    unprintable,
)


def refused(check: object, *args: object) -> str:
    with pytest.raises(InvalidField) as info:
        check(*args)  # type: ignore[operator]
    assert str(info.value).startswith(f"{args[0]}: ")
    return str(info.value)


@given(st.text(max_size=80))
def test_a_name_is_accepted_only_when_it_matches_in_full(value: str) -> None:
    try:
        check_name("node_name", value)
    except InvalidField as exc:
        assert exc.field == "node_name" and len(str(exc)) < 300
        return
    assert 1 <= len(value) <= MAX_NAME_LENGTH
    assert value[0].isascii() and value[0].isalnum()
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in value)


@pytest.mark.parametrize("value", ["abc\n", "a\x00", "", "-a", "a b", "x" * 64, "é", "a\u200bb"])
def test_names_refused(value: str) -> None:
    refused(check_name, "node_name", value)


@given(st.text(max_size=300))
def test_an_address_is_an_ip_or_a_host_name(value: str) -> None:
    try:
        check_address("address", value)
    except InvalidField:
        return
    assert unprintable(value) is None and len(value) <= 253
    try:
        ipaddress.ip_address(value)
    except ValueError:
        assert all(1 <= len(label) <= 63 for label in value.split("."))
        assert not value.split(".")[-1].isdigit()


@pytest.mark.parametrize("value", ["127.0.0.1", "::1", "10.0.0.7", "node-1", "vm3.example.com", "fd00::5"])
def test_addresses_accepted(value: str) -> None:
    assert check_address("address", value) == value


@pytest.mark.parametrize(
    "value", ["127.0.0.1\x00", "", "0.0.0.0", "::", "a..b", "-a.b", "host:80", "1.2.3.999", "fe80::1%eth0", "a b"]
)
def test_addresses_refused(value: str) -> None:
    refused(check_address, "address", value)


@given(st.text(alphabet=st.sampled_from("/a.b\x00\n"), max_size=30))
def test_a_path_is_absolute_and_normalised(value: str) -> None:
    try:
        check_absolute_path("checkpoint_dir", value)
    except InvalidField:
        return
    assert value.startswith("/") and posixpath.normpath(value) == value and "\x00" not in value


@pytest.mark.parametrize("value", ["ckpt", "./ckpt", "/a/../b", "/a/", "//a", "/a//b", "/a\x00b", ""])
def test_paths_refused(value: str) -> None:
    refused(check_absolute_path, "checkpoint_dir", value)


def test_entrypoints() -> None:
    assert check_entrypoint("entrypoint", "/x/model.py:build") == "/x/model.py:build"
    assert check_entrypoint("entrypoint", "pkg.mod:build") == "pkg.mod:build"
    assert entrypoint_file("/x/model.py:build") == "/x/model.py"
    assert entrypoint_file("pkg.mod:build") is None
    for bad in ["model.py:build", "/x/../model.py:build", "/x/model.txt/y:b", "pkg..mod:b", "/x/m.py:", "a:1b"]:
        refused(check_entrypoint, "entrypoint", bad)


@given(st.integers(min_value=-(2**70), max_value=2**70), st.integers(min_value=1, max_value=10**9))
def test_numbers_in_range(value: int, steps: int) -> None:
    try:
        check_count("generation", value)
        assert 0 <= value <= STORABLE_INT
    except InvalidField as exc:
        assert exc.field == "generation" and not 0 <= value <= STORABLE_INT
    try:
        check_step("last_step", value, steps)
        assert 0 <= value <= steps
    except InvalidField as exc:
        assert "beyond" in str(exc) and not 0 <= value <= steps


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_times_are_finite_unix_seconds(value: float) -> None:
    try:
        assert check_time("eviction.not_before", value) == value
        assert math.isfinite(value) and 0 <= value <= LATEST_TIME
    except InvalidField as exc:
        assert "not a time" in str(exc)


def test_messages_quote_hostile_values_short() -> None:
    assert len(shown("x" * 1_000_000)) < 60
    assert len(refused(check_text, "instance_id", "y" * 1_000_000, 256)) < 100
    assert "\\x00" in refused(check_text, "instance_id", "a\x00", 256)


@given(st.text(max_size=5000))
def test_printable_text_keeps_lines_and_drops_controls(value: str) -> None:
    kept = printable(value, 1000)
    assert len(kept) <= 1000 and unprintable(kept.replace("\n", "").replace("\t", "")) is None
