"""Token files: ``spotmorph data prepare`` writes them, :class:`TokenFileDataset` reads fixed windows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from morphing.errors import UserInputError
from spotmorph.cli import main
from spotmorph.data import TokenFileDataset, prepare_token_file
from worker_agent.runtime.model.data import sidecar_path
from worker_agent.runtime.numerics.batch import count_target_tokens


def write_tokens(path: Path, tokens: list[int], dtype: str = "uint16", sidecar: bool = True) -> Path:
    np.asarray(tokens, dtype=dtype).astype(np.dtype(dtype).newbyteorder("<")).tofile(path)
    if sidecar:
        meta = {"format": "spotmorph.tokens/v1", "dtype": dtype, "tokens": len(tokens), "vocab_size": 70000}
        sidecar_path(path).write_text(json.dumps(meta))
    return path


def word_tokenizer(path: Path) -> Path:
    """A tokenizers JSON file built here (no download): whitespace words, an unknown token, an end token."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"[UNK]": 0, "</s>": 1, "hello": 2, "world": 3, "again": 4}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(path))
    return path


def test_byte_files_round_trip_with_a_separator_after_each_document(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"abc\n")
    (tmp_path / "b.txt").write_bytes("é\x00".encode())
    out = tmp_path / "data" / "train.bin"
    assert main(["data", "prepare", str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), f"--out={out}"]) == 0
    meta = json.loads(sidecar_path(out).read_text())
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 257 and meta["eos_id"] == 256
    stream = [*b"abc\n", 256, *"é\x00".encode(), 256]
    assert meta["tokens"] == len(stream)
    ds = TokenFileDataset(out, seq_len=3)
    assert len(ds) == (len(stream) - 1) // 3
    x, y = ds[1]
    assert x.tolist() == stream[3:6] and y.tolist() == stream[4:7] and x.dtype == torch.int64


def test_a_tokenizers_json_file_and_an_end_token(tmp_path: Path) -> None:
    tok = word_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "a.txt").write_text("hello world\nhello again")
    (tmp_path / "b.txt").write_text("world unknownword")
    out = tmp_path / "words.bin"
    meta = prepare_token_file([tmp_path / "a.txt", tmp_path / "b.txt"], out, str(tok), "</s>")
    assert meta["eos_id"] == 1 and meta["vocab_size"] == 5
    assert np.fromfile(out, dtype="<u2").tolist() == [2, 3, 2, 4, 1, 3, 0, 1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.txt"], "text file missing.txt does not exist"),
        (["a.txt", "--tokenizer=nope.json"], "use 'byte' or the path of a tokenizers JSON file"),
        (["a.txt", "--tokenizer=a.txt"], "is not a tokenizers JSON file"),
        (["a.txt", "--eos=x"], "--eos applies to a tokenizers JSON file"),
        (["a.txt", "--tokenizer=tok.json", "--eos=<eos>"], "--eos '<eos>' is not a token of"),
        (["binary.dat", "--tokenizer=tok.json"], "binary.dat is not UTF-8 text"),
        (["empty.txt"], "no tokens (the files are empty)"),
    ],
)
def test_bad_input_exits_2_naming_the_problem(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("a.txt").write_text("hello")
    Path("empty.txt").write_text("")
    Path("binary.dat").write_bytes(b"\xff\xfe\x00")
    word_tokenizer(tmp_path / "tok.json")
    assert main(["data", "prepare", *args, "--out=out.bin"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not Path("out.bin").exists()


def test_the_output_must_not_be_a_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello")
    assert main(["data", "prepare", str(tmp_path / "a.txt"), f"--out={tmp_path}"]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_dtype_comes_from_the_sidecar_or_the_argument(tmp_path: Path) -> None:
    raw = write_tokens(tmp_path / "raw.bin", list(range(70000, 70010)), "uint32", sidecar=False)
    with pytest.raises(UserInputError, match=r"has no sidecar raw\.bin\.json: pass dtype="):
        TokenFileDataset(raw, 4)
    assert TokenFileDataset(raw, 4, dtype="uint32")[0][0].tolist() == [70000, 70001, 70002, 70003]
    described = write_tokens(tmp_path / "described.bin", list(range(10)), "uint16")
    with pytest.raises(UserInputError, match="holds uint16 tokens"):
        TokenFileDataset(described, 4, dtype="uint32")
    (tmp_path / "odd.bin").write_bytes(b"\x00\x01\x02")
    with pytest.raises(UserInputError, match="not a whole number of uint16 tokens"):
        TokenFileDataset(tmp_path / "odd.bin", 1, dtype="uint16")
    with pytest.raises(UserInputError, match="fewer than seq_len \\+ 1 = 11 tokens"):
        TokenFileDataset(described, 10)
    with pytest.raises(UserInputError, match="does not exist"):
        TokenFileDataset(tmp_path / "none.bin", 4)


def test_shards_in_a_directory_are_read_in_name_order_and_windows_stay_inside_one(tmp_path: Path) -> None:
    write_tokens(tmp_path / "b.bin", list(range(100, 107)))
    write_tokens(tmp_path / "a.bin", list(range(10)))
    ds = TokenFileDataset(tmp_path, 3)
    assert len(ds) == 3 + 2
    assert [ds[i][0].tolist() for i in range(5)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [100, 101, 102], [103, 104, 105]]
    assert ds[4][1].tolist() == [104, 105, 106]
    assert count_target_tokens(ds, [0, 4, 4]) == 9
    with pytest.raises(IndexError):
        ds[5]


@settings(max_examples=40, deadline=None)
@given(
    shards=st.lists(st.lists(st.integers(0, 65535), min_size=0, max_size=40), min_size=1, max_size=3),
    seq_len=st.integers(1, 8),
)
def test_windows_are_consecutive_slices_of_each_shard(
    tmp_path_factory: pytest.TempPathFactory, shards: list[list[int]], seq_len: int
) -> None:
    root = tmp_path_factory.mktemp("shards")
    paths = [write_tokens(root / f"s{i}.bin", tokens) for i, tokens in enumerate(shards)]
    expected = [
        (tokens[w * seq_len : w * seq_len + seq_len], tokens[w * seq_len + 1 : w * seq_len + seq_len + 1])
        for tokens in shards
        for w in range(max(0, (len(tokens) - 1) // seq_len))
    ]
    if not expected:
        with pytest.raises(UserInputError):
            TokenFileDataset(paths, seq_len)
        return
    ds = TokenFileDataset(paths, seq_len)
    assert [(x.tolist(), y.tolist()) for x, y in (ds[i] for i in range(len(ds)))] == expected


@pytest.mark.parametrize("vocab_size", [True, -5, 1e12, "257", 2**40])
def test_a_sidecar_vocab_size_that_is_no_vocabulary_is_refused(tmp_path: Path, vocab_size: object) -> None:
    path = write_tokens(tmp_path / "t.bin", list(range(10)))
    meta = json.loads(sidecar_path(path).read_text())
    sidecar_path(path).write_text(json.dumps({**meta, "vocab_size": vocab_size}))
    with pytest.raises(UserInputError, match=rf"t\.bin\.json: vocab_size {vocab_size!r} is not an integer from 1"):
        TokenFileDataset(path, 4)


def test_an_id_at_or_past_the_vocabulary_is_refused_at_open_naming_the_file_the_id_and_the_vocabulary(
    tmp_path: Path,
) -> None:
    path = write_tokens(tmp_path / "t.bin", [1, 2, 3, 256, 300, 5, 6, 7])
    meta = json.loads(sidecar_path(path).read_text())
    sidecar_path(path).write_text(json.dumps({**meta, "vocab_size": 257}))
    with pytest.raises(UserInputError, match=r"t\.bin holds id 300 at token 4, but its sidecar's vocab_size is 257"):
        TokenFileDataset(path, 4)


def test_an_id_written_past_the_vocabulary_after_open_fails_its_window_as_a_user_error(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "t.bin", list(range(9)))
    meta = json.loads(sidecar_path(path).read_text())
    sidecar_path(path).write_text(json.dumps({**meta, "vocab_size": 257}))
    ds = TokenFileDataset(path, 4)
    assert ds.vocab_size == 257
    with open(path, "r+b") as fh:
        fh.seek(6 * 2)
        fh.write(np.asarray([300], dtype="<u2").tobytes())
    assert ds[0][0].tolist() == [0, 1, 2, 3]
    with pytest.raises(UserInputError, match=r"holds id 300 at token 6, but its sidecar's vocab_size is 257"):
        ds[1]


def test_a_token_file_shorter_than_its_sidecar_says_or_no_regular_file_is_refused(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "t.bin", list(range(10)))
    os.truncate(path, 8)
    with pytest.raises(UserInputError, match=r"t\.bin holds 4 tokens but its sidecar says 10: the file was truncated"):
        TokenFileDataset(path, 2)
    os.mkfifo(tmp_path / "fifo.bin")
    with pytest.raises(UserInputError, match=r"fifo\.bin does not exist \(or is not a regular file\)"):
        TokenFileDataset(tmp_path / "fifo.bin", 2, dtype="uint16")


TRUNCATE_WHILE_READING = """
import os, sys
from pathlib import Path
from morphing.errors import UserInputError
from spotmorph.data import TokenFileDataset
path = Path(sys.argv[1])
ds = TokenFileDataset(path, 4)
os.truncate(path, 0)  # another process empties the file under the running reader
try:
    ds[len(ds) - 1]
except UserInputError as exc:
    print(exc)
    sys.exit(2)
"""


def test_a_token_file_truncated_under_a_reader_is_a_user_error_not_sigbus(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "t.bin", [7] * 100_000)
    result = subprocess.run(
        [sys.executable, "-c", TRUNCATE_WHILE_READING, str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, (result.returncode, result.stderr)  # -7 (SIGBUS) when the file was mapped
    assert "is shorter than the 200000 bytes it had when training started: it was truncated" in result.stdout
