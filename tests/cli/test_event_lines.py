"""`spotmorph events` prints each event as one readable line: fields as key=value words, not a dict repr."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controller.client.commands.events import describe


def test_fields_read_as_words() -> None:
    data = {"address": "127.0.0.1", "loss": 3.308656037039275, "cause": "first heartbeat", "ok": True, "x": None}
    assert describe(data) == 'address=127.0.0.1 loss=3.30866 cause="first heartbeat" ok=true x=null'
    assert describe({"gpus": [{"index": 0, "name": "H100"}], "e": ""}) == 'gpus=[{"index":0,"name":"H100"}] e=""'


@given(st.dictionaries(st.from_regex(r"[a-z_]{1,12}", fullmatch=True), st.text(max_size=20), max_size=5))
def test_every_field_is_one_word_whatever_its_text(data: dict[str, str]) -> None:
    """A value with spaces, quotes or '=' is quoted, so the line splits back into exactly its fields."""
    import shlex

    words = shlex.split(describe(data), posix=True) if data else []
    assert len(words) == len(data)
