"""Token files: text turned into a flat stream of token ids once, read back as fixed-length windows.

A token file ``FILE.bin`` holds little-endian ``uint16`` or ``uint32`` ids back to back (the layout
nanoGPT and others use), with a sidecar ``FILE.bin.json`` that says the dtype, so a reader never has to
guess it: ``{"format": "spotmorph.tokens/v1", "dtype": "uint16", "tokens": N, "vocab_size": V,
"tokenizer": ..., "eos_id": ...}``. :class:`TokenFileDataset` cuts each file into windows of
``seq_len + 1`` tokens: item ``i`` is ``(ids[w : w + seq_len], ids[w + 1 : w + seq_len + 1])``, a pure
function of ``i`` so the runtime's data order stays layout-free. Windows never span two files (shards).

The files are the user's, and can change under a running trainer: they are read with ``pread`` (a file
truncated meanwhile is a short read, named as a user error, where a memory map would kill the process
with SIGBUS), and every id is checked against the sidecar's vocabulary once at open (in chunks, at the
speed of a sequential read) and again in each window read (an id at or past the vocabulary would fail
deep inside the model's embedding).
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from morphing.errors import UserInputError
from worker_agent.contract.hostile import HostileFile, load_json_bounded, open_regular

FORMAT = "spotmorph.tokens/v1"
TOKEN_DTYPES: dict[str, Any] = {"uint16": np.uint16, "uint32": np.uint32}
BYTE_VOCAB = 257  # bytes 0..255 and 256, the end-of-document separator
BYTE_EOS = 256
CHUNK = 16 << 20
MAX_SIDECAR_BYTES = 1 << 20
MAX_VOCAB = 1 << 32  # what a uint32 id can name


def sidecar_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def read_sidecar(path: Path) -> dict[str, Any] | None:
    side = sidecar_path(path)
    if not side.exists():
        return None
    try:
        meta = load_json_bounded(side, MAX_SIDECAR_BYTES, follow_symlinks=True)
    except (OSError, HostileFile) as exc:
        raise UserInputError(f"token file sidecar {side} is unreadable: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("dtype") not in TOKEN_DTYPES:
        raise UserInputError(f"token file sidecar {side} is not {FORMAT} with a dtype of {', '.join(TOKEN_DTYPES)}")
    for key, low, high in (("vocab_size", 1, MAX_VOCAB), ("tokens", 0, 1 << 62)):
        value = meta.get(key)
        if value is not None and (type(value) is not int or not low <= value <= high):
            raise UserInputError(
                f"token file sidecar {side}: {key} {value!r} is not an integer from {low} to {high}; "
                "write the file again with spotmorph data prepare"
            )
    return meta


class _Shard:
    """One token file, read with ``pread``: never memory-mapped, so truncating it cannot kill the reader."""

    def __init__(self, path: Path, dtype: np.dtype[Any], vocab_size: int | None) -> None:
        self.path = path
        self.dtype = dtype
        self.vocab_size = vocab_size
        try:
            self.fd = open_regular(path, follow_symlinks=True)
        except (OSError, HostileFile) as exc:
            raise UserInputError(f"token file {path} cannot be read: {exc}") from None
        self.size = os.fstat(self.fd).st_size
        self.tokens = self.size // dtype.itemsize

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()

    def read(self, start: int, count: int) -> np.ndarray[Any, Any]:
        """Tokens ``[start, start + count)``; a user error when the file is shorter now, or holds an id past
        the vocabulary."""
        want = count * self.dtype.itemsize
        try:
            data = os.pread(self.fd, want, start * self.dtype.itemsize)
        except OSError as exc:
            raise UserInputError(f"token file {self.path} cannot be read: {exc.strerror or exc}") from None
        if len(data) != want:
            raise UserInputError(
                f"token file {self.path} is shorter than the {self.size} bytes it had when training started: it "
                "was truncated or replaced meanwhile; put the whole file back (a token file must not change "
                "while a job reads it)"
            )
        ids = np.frombuffer(data, dtype=self.dtype)
        self.check_ids(ids, start)
        return ids

    def check_ids(self, ids: np.ndarray[Any, Any], start: int) -> None:
        if self.vocab_size is None or not len(ids) or int(ids.max()) < self.vocab_size:
            return
        at = int(np.argmax(ids >= self.vocab_size))
        raise UserInputError(
            f"token file {self.path} holds id {int(ids[at])} at token {start + at}, but its sidecar's vocab_size "
            f"is {self.vocab_size} (ids must be below it): the file was written with another tokenizer or is "
            "damaged; prepare it again with spotmorph data prepare"
        )

    def check_all(self) -> None:
        """Every id against the vocabulary, ``CHUNK`` bytes at a time (a sequential read of the file)."""
        if self.vocab_size is None:
            return
        step = CHUNK // self.dtype.itemsize
        for start in range(0, self.tokens, step):
            self.read(start, min(step, self.tokens - start))


def _shard_paths(path: str | Path | Sequence[str | Path]) -> list[Path]:
    if isinstance(path, str | Path):
        root = Path(path)
        paths = sorted(root.glob("*.bin")) if root.is_dir() else [root]
    else:
        paths = [Path(p) for p in path]
    if not paths:
        raise UserInputError(f"no token files in {path}")
    for p in paths:
        if not p.is_file():
            raise UserInputError(f"token file {p} does not exist (or is not a regular file)")
    return paths


class TokenFileDataset:
    """Fixed-length next-token windows over one or several token files (shards).

    ``dtype`` ("uint16" or "uint32") is needed only for files without a sidecar; ``path`` may be a file,
    a directory (its ``*.bin`` files, sorted by name) or a list of files, read in that order.
    """

    def __init__(self, path: str | Path | Sequence[str | Path], seq_len: int, dtype: str | None = None) -> None:
        if seq_len < 1:
            raise UserInputError(f"seq_len={seq_len}; it must be >= 1")
        if dtype is not None and dtype not in TOKEN_DTYPES:
            raise UserInputError(f"dtype={dtype!r}; use one of {', '.join(TOKEN_DTYPES)}")
        self.seq_len = seq_len
        self.paths = _shard_paths(path)
        self.vocab_size: int | None = None
        self._shards: list[_Shard] = []
        self._starts: list[int] = []
        total = 0
        for p in self.paths:
            shard = self._open(p, dtype)
            windows = max(0, (shard.tokens - 1) // seq_len)
            if windows:
                self._shards.append(shard)
                self._starts.append(total)
                total += windows
            else:
                shard.close()
        if total == 0:
            raise UserInputError(f"{', '.join(map(str, self.paths))}: fewer than seq_len + 1 = {seq_len + 1} tokens")
        self._len = total

    def _open(self, path: Path, dtype: str | None) -> _Shard:
        meta = read_sidecar(path)
        vocab_size = None
        if meta is not None:
            if dtype is not None and dtype != meta["dtype"]:
                raise UserInputError(f"{path} holds {meta['dtype']} tokens (its sidecar says so), not {dtype}")
            dtype = str(meta["dtype"])
            vocab_size = meta.get("vocab_size")
            if vocab_size is not None:
                self.vocab_size = max(self.vocab_size or 0, vocab_size)
        if dtype is None:
            raise UserInputError(
                f"{path} has no sidecar {sidecar_path(path).name}: pass dtype='uint16' or 'uint32' "
                "(spotmorph data prepare writes the sidecar)"
            )
        shard = _Shard(path, np.dtype(TOKEN_DTYPES[dtype]).newbyteorder("<"), vocab_size)
        if shard.size % shard.dtype.itemsize:
            shard.close()
            raise UserInputError(f"{path} is {shard.size} bytes, not a whole number of {dtype} tokens")
        told = None if meta is None else meta.get("tokens")
        if told is not None and told != shard.tokens:
            shard.close()
            raise UserInputError(
                f"{path} holds {shard.tokens} tokens but its sidecar says {told}: the file was truncated or "
                "replaced after spotmorph data prepare wrote it; prepare it again"
            )
        shard.check_all()
        return shard

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self._len:
            raise IndexError(f"window {index} is outside 0..{self._len - 1}")
        shard = bisect.bisect_right(self._starts, index) - 1
        start = (index - self._starts[shard]) * self.seq_len
        ids = self._shards[shard].read(start, self.seq_len + 1)
        window = torch.from_numpy(ids.astype(np.int64))
        return window[:-1], window[1:]

    def count_target_tokens(self, indices: Sequence[int]) -> int:
        """Every target of a token file counts (none is ignored): the token-mode denominator, fast."""
        return len(indices) * self.seq_len


class ByteTokenizer:
    """Bytes are tokens (0..255), 256 ends a document: no vocabulary file, any text or binary input."""

    name = "byte"
    vocab_size = BYTE_VOCAB
    eos_id: int | None = BYTE_EOS

    def encode_file(self, path: Path) -> list[np.ndarray[Any, Any]]:
        with open(path, "rb") as fh:
            chunks = iter(lambda: fh.read(CHUNK), b"")
            return [np.frombuffer(chunk, dtype=np.uint8).astype(np.uint32) for chunk in chunks]


class FileTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer saved as JSON (``tokenizer.json``), read from a local file."""

    def __init__(self, path: Path, eos_token: str | None) -> None:
        from tokenizers import Tokenizer

        if not path.is_file():
            raise UserInputError(f"--tokenizer {path}: use 'byte' or the path of a tokenizers JSON file")
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise UserInputError(f"--tokenizer {path} is not a tokenizers JSON file: {exc}") from exc
        self.name = str(path)
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.eos_id = None
        if eos_token is not None:
            found = self._tok.token_to_id(eos_token)
            if found is None:
                raise UserInputError(f"--eos {eos_token!r} is not a token of {path}")
            self.eos_id = int(found)

    def encode_file(self, path: Path) -> list[np.ndarray[Any, Any]]:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise UserInputError(
                f"{path} is not UTF-8 text (byte {exc.start}); the byte tokenizer reads any file"
            ) from exc
        return [np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.uint32)]


def make_tokenizer(spec: str, eos_token: str | None = None) -> ByteTokenizer | FileTokenizer:
    if spec == "byte":
        if eos_token is not None:
            raise UserInputError("--eos applies to a tokenizers JSON file; the byte tokenizer ends documents with 256")
        return ByteTokenizer()
    return FileTokenizer(Path(spec), eos_token)


def prepare_token_file(
    texts: Sequence[Path], out: Path, tokenizer: str = "byte", eos_token: str | None = None
) -> dict[str, Any]:
    """Tokenize ``texts`` (one document each, in order) into ``out`` and its sidecar; returns the sidecar.

    The file is written under a temporary name and renamed, then the sidecar, so a reader never sees a
    half-written file described as complete.
    """
    if not texts:
        raise UserInputError("no text files given")
    for text in texts:
        if not text.is_file():
            raise UserInputError(f"text file {text} does not exist (or is not a file)")
    if out.is_dir():
        raise UserInputError(f"--out {out} is a directory; name the .bin file to write")
    tok = make_tokenizer(tokenizer, eos_token)
    dtype = "uint16" if tok.vocab_size <= 1 << 16 else "uint32"
    np_dtype = np.dtype(TOKEN_DTYPES[dtype]).newbyteorder("<")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tokens = text_tokens = 0
    with open(tmp, "wb") as fh:
        for text in texts:
            parts = tok.encode_file(text)
            text_tokens += sum(len(part) for part in parts)
            if tok.eos_id is not None:
                parts.append(np.asarray([tok.eos_id], dtype=np.uint32))
            for part in parts:
                part.astype(np_dtype).tofile(fh)
                tokens += len(part)
        fh.flush()
        os.fsync(fh.fileno())
    if text_tokens == 0:
        tmp.unlink()
        raise UserInputError(f"{', '.join(map(str, texts))}: no tokens (the files are empty)")
    sidecar_path(out).unlink(missing_ok=True)  # an old sidecar must not describe the new file
    os.replace(tmp, out)
    meta = {
        "format": FORMAT,
        "dtype": dtype,
        "tokens": tokens,
        "vocab_size": tok.vocab_size,
        "tokenizer": tok.name,
        "eos_id": tok.eos_id,
        "sources": [str(t) for t in texts],
    }
    side_tmp = out.with_name(out.name + ".json.tmp")
    side_tmp.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(side_tmp, sidecar_path(out))
    return meta
