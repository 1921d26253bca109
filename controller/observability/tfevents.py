"""TensorBoard event files, written without TensorFlow, TensorBoard or torch in the controller.

An event file is a sequence of TFRecords (length, masked CRC-32C of the length, the bytes, their masked
CRC-32C), each an ``Event`` protocol buffer: the first says ``file_version``, the others carry a
``Summary`` of scalars (``simple_value``) or text (a string tensor with the text plugin's metadata).
The few fields needed are encoded here by hand (protobuf wire format); TensorBoard's own reader is
what the tests read them back with.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path
from typing import BinaryIO


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum TFRecords use."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """One TFRecord holding ``data``."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1  # negative int64 as protobuf encodes it: ten bytes of two's complement
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, field: bytes) -> bytes:
    return _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3) + _varint(step) + field


def scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    summary_value = _bytes_field(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", value)
    return _event(wall_time, step, _bytes_field(5, _bytes_field(1, summary_value)))


def text_event(tag: str, text: str, step: int, wall_time: float) -> bytes:
    """A text summary as TensorBoard's text plugin writes it: a scalar string tensor (DT_STRING = 7)."""
    tensor = _varint(1 << 3) + _varint(7) + _bytes_field(2, b"") + _bytes_field(8, text.encode())
    metadata = _bytes_field(1, _bytes_field(1, b"text"))
    summary_value = _bytes_field(1, tag.encode()) + _bytes_field(9, metadata) + _bytes_field(8, tensor)
    return _event(wall_time, step, _bytes_field(5, _bytes_field(1, summary_value)))


def version_event(wall_time: float) -> bytes:
    return _event(wall_time, 0, _bytes_field(3, b"brain.Event:2"))


class EventFile:
    """One append-only event file in ``folder`` (named as TensorBoard's writers name theirs)."""

    def __init__(self, folder: Path, wall_time: float | None = None) -> None:
        now = time.time() if wall_time is None else wall_time
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.spotmorph"
        self._file: BinaryIO = self.path.open("ab")
        self._write(version_event(now))
        self.flush()

    def scalar(self, tag: str, value: float, step: int, wall_time: float) -> None:
        self._write(scalar_event(tag, value, step, wall_time))

    def text(self, tag: str, text: str, step: int, wall_time: float) -> None:
        self._write(text_event(tag, text, step, wall_time))

    def _write(self, event: bytes) -> None:
        self._file.write(record(event))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
