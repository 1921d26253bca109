"""The generation's rendezvous store, open only to the processes that hold its key.

torch's TCPStore listens on every interface and answers anyone: a local process with no token read and wrote a
job's keys, and by listening first on a later generation's port it failed the job. This store replaces it for
the trainers' rendezvous (gloo and NCCL set-up, group creation, the held-state exchange):

- its server, in the generation's rank 0, listens on the address the controller named for the rendezvous (the
  node's own, never a wildcard); a port it cannot bind raises :class:`PortTaken` (not the trainer's failure);
- every connection proves the generation's key before the server reads a request: the server sends a nonce,
  the client answers with its own nonce and HMAC-SHA256(key, "client" | both nonces), and the server answers
  HMAC-SHA256(key, "server" | both nonces), so the client knows it reached its own rank 0 and not a process
  that took the port (:class:`StoreAuthFailed`); a connection that does not prove it within
  :data:`HANDSHAKE_SECONDS` is closed, and at most :data:`MAX_HANDSHAKES` prove at once;
- requests and answers are length-prefixed frames of at most :data:`MAX_FRAME_BYTES`; the whole store holds at
  most :data:`MAX_STORE_BYTES`.

The key is 32 random-looking bytes per generation (the controller derives it from its own secret and hands it
to each node's agent with the assignment; ``spotmorph train`` draws one), kept in a file only its user reads.
What it does not do: encrypt (a store holds addresses and NCCL ids, no model data), or authenticate gloo's and
NCCL's own peer connections, which bind the node's interface (docs/DESIGN.md, the data plane's threat model).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

MAGIC = b"SPMS1"
NONCE_BYTES = 32
HANDSHAKE_SECONDS = 5.0
MAX_HANDSHAKES = 64  # connections proving the key at once; more wait in the kernel's backlog
MAX_CONNECTIONS = 4096
MAX_FRAME_BYTES = 1 << 20
MAX_STORE_BYTES = 64 << 20
KEY_BYTES = 32

SET, GET, ADD, CAS, WAIT, CHECK, DELETE, NUM_KEYS = range(1, 9)
OK, TIMED_OUT, REFUSED = 0, 1, 2


class PortTaken(OSError):
    """The rendezvous port cannot be bound on this node (another process holds it): not the trainer's failure."""


class StoreAuthFailed(ConnectionError):
    """What answered at the rendezvous address did not prove the generation's key."""


def read_key(path: str | os.PathLike[str]) -> bytes:
    """The generation's key from its file (hex); ``ValueError`` naming the file when it is not one."""
    with open(path, "rb") as handle:
        text = handle.read(4 * KEY_BYTES).strip()
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise ValueError(f"{path}: not a rendezvous key ({2 * KEY_BYTES} hex digits)")
    return key


def _mac(key: bytes, side: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(key, MAGIC + side + first + second, hashlib.sha256).digest()


def _exact(sock: socket.socket, size: int, deadline: float | None = None) -> bytes:
    """``size`` bytes; with ``deadline`` (monotonic), before it, however slowly they trickle in."""
    data = bytearray()
    while len(data) < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the handshake took too long")
            sock.settimeout(left)
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the connection closed")
        data += chunk
    return bytes(data)


def _send_frame(sock: socket.socket, parts: list[bytes]) -> None:
    body = b"".join(struct.pack(">I", len(p)) + p for p in parts)
    sock.sendall(struct.pack(">I", len(body)) + body)


def _read_frame(sock: socket.socket) -> list[bytes]:
    (size,) = struct.unpack(">I", _exact(sock, 4))
    if size > MAX_FRAME_BYTES:
        raise ConnectionError(f"a frame of {size} bytes, more than {MAX_FRAME_BYTES}")
    body, parts, at = _exact(sock, size), [], 0
    while at < len(body):
        if at + 4 > len(body):
            raise ConnectionError("a frame cut short")
        (length,) = struct.unpack(">I", body[at : at + 4])
        if at + 4 + length > len(body):
            raise ConnectionError("a frame cut short")
        parts.append(body[at + 4 : at + 4 + length])
        at += 4 + length
    return parts


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on exactly ``host:port`` (never a wildcard); :class:`PortTaken` when it is held."""
    if host in ("", "0.0.0.0", "::", "*"):
        raise ValueError(f"the rendezvous must bind the node's own address, not {host!r}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            taken = f"the rendezvous port {host}:{port} is taken on this node: {exc.strerror}"
            raise PortTaken(exc.errno, taken) from exc
        raise
    return sock


class Table:
    """The store's keys and values, shared by the connections' threads."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.size = 0
        self.changed = threading.Condition()

    def answer(self, parts: list[bytes]) -> list[bytes]:
        """One request's answer: ``[status, *values]``."""
        if not parts or len(parts[0]) != 1:
            return [bytes([REFUSED]), b"a request starts with its operation"]
        op, args = parts[0][0], parts[1:]
        with self.changed:
            try:
                return self._answer(op, args)
            except (ValueError, IndexError, UnicodeDecodeError) as exc:
                return [bytes([REFUSED]), str(exc).encode()[:200]]

    def _answer(self, op: int, args: list[bytes]) -> list[bytes]:
        ok = bytes([OK])
        if op == SET:
            self._put(args[0].decode(), args[1])
            return [ok]
        if op == GET:
            key = args[0].decode()
            if not self._until(lambda: key in self.data, args[1]):
                return [bytes([TIMED_OUT])]
            return [ok, self.data[key]]
        if op == ADD:
            key = args[0].decode()
            value = int(self.data.get(key, b"0")) + int(args[1])
            self._put(key, str(value).encode())
            return [ok, str(value).encode()]
        if op == CAS:
            key, expected, desired = args[0].decode(), args[1], args[2]
            current = self.data.get(key)
            if (current is None and expected == b"") or current == expected:
                self._put(key, desired)
                return [ok, desired]
            return [ok, expected if current is None else current]
        if op == WAIT:
            keys = [k.decode() for k in args[1:]]
            if not self._until(lambda: all(k in self.data for k in keys), args[0]):
                return [bytes([TIMED_OUT])]
            return [ok]
        if op == CHECK:
            return [ok, b"1" if all(k.decode() in self.data for k in args) else b"0"]
        if op == DELETE:
            gone = self.data.pop(args[0].decode(), None)
            self.size -= len(gone) if gone is not None else 0
            return [ok, b"1" if gone is not None else b"0"]
        if op == NUM_KEYS:
            return [ok, str(len(self.data)).encode()]
        raise ValueError(f"no operation {op}")

    def _put(self, key: str, value: bytes) -> None:
        old = self.data.get(key)
        grown = self.size + len(value) + len(key) - (len(old) + len(key) if old is not None else 0)
        if grown > MAX_STORE_BYTES:
            raise ValueError(f"the store would hold {grown} bytes, more than {MAX_STORE_BYTES}")
        self.data[key], self.size = value, grown
        self.changed.notify_all()

    def _until(self, ready: Callable[[], bool], timeout_ms: bytes) -> bool:
        return self.changed.wait_for(ready, timeout=max(0.0, int(timeout_ms) / 1000))


def _handshake_as_server(conn: socket.socket, key: bytes) -> bool:
    deadline = time.monotonic() + HANDSHAKE_SECONDS
    ours = os.urandom(NONCE_BYTES)
    conn.settimeout(HANDSHAKE_SECONDS)
    conn.sendall(MAGIC + ours)
    reply = _exact(conn, 2 * NONCE_BYTES, deadline)
    theirs, mac = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
    if not hmac.compare_digest(mac, _mac(key, b"client", ours, theirs)):
        return False
    conn.sendall(_mac(key, b"server", ours, theirs))
    conn.settimeout(None)
    return True


def _serve(conn: socket.socket, key: bytes, table: Table, gate: threading.BoundedSemaphore) -> None:
    try:
        with gate:
            proven = _handshake_as_server(conn, key)
        while proven:
            _send_frame(conn, table.answer(_read_frame(conn)))
    except (OSError, ConnectionError, struct.error):
        pass  # a peer that left, or one that never proved the key: nothing of it reached the table
    finally:
        conn.close()


def _accept(listener: socket.socket, key: bytes, table: Table) -> None:
    gate = threading.BoundedSemaphore(MAX_HANDSHAKES)
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # closed
        if threading.active_count() > MAX_CONNECTIONS:
            conn.close()
            continue
        threading.Thread(target=_serve, args=(conn, key, table, gate), daemon=True).start()


class StoreServer:
    """The store, served on ``host:port`` to whoever proves ``key``; :meth:`close` (or losing the last
    reference) stops it."""

    def __init__(self, host: str, port: int, key: bytes) -> None:
        self._listener = bind(host, port)
        self.address = (host, self._listener.getsockname()[1])
        self.table = Table()
        threading.Thread(
            target=_accept, args=(self._listener, key, self.table), daemon=True, name="spotmorph-store"
        ).start()

    def close(self) -> None:
        listener = getattr(self, "_listener", None)  # None: the constructor failed before it bound
        if listener is None:
            return
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()

    def __del__(self) -> None:
        self.close()


class GatedStore(dist.Store):  # type: ignore[misc,name-defined]  # torch's pybind class, not in the stubs
    """A client of :class:`StoreServer`: one connection per thread, each proving the key first, and checking
    that what answered proved it too. ``server``: the server this process hosts, kept alive with the store."""

    def __init__(self, host: str, port: int, key: bytes, timeout: timedelta, server: StoreServer | None = None):
        super().__init__()
        self._address, self._key, self._wait = (host, port), key, timeout
        self._local = threading.local()
        self._clones: list[GatedStore] = []
        self.server = server

    def _connection(self) -> socket.socket:
        conn: socket.socket | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = socket.create_connection(self._address, timeout=HANDSHAKE_SECONDS)
            deadline = time.monotonic() + HANDSHAKE_SECONDS
            try:
                hello = _exact(conn, len(MAGIC) + NONCE_BYTES, deadline)
                if hello[: len(MAGIC)] != MAGIC:
                    raise StoreAuthFailed(f"{self._where()} is not a spotmorph rendezvous store")
                theirs, ours = hello[len(MAGIC) :], os.urandom(NONCE_BYTES)
                conn.sendall(ours + _mac(self._key, b"client", theirs, ours))
                proof = _exact(conn, hashlib.sha256().digest_size, deadline)
            except (OSError, ConnectionError) as exc:
                conn.close()
                raise StoreAuthFailed(f"{self._where()} refused this generation's key: {exc}") from exc
            if not hmac.compare_digest(proof, _mac(self._key, b"server", theirs, ours)):
                conn.close()
                raise StoreAuthFailed(f"{self._where()} did not prove this generation's key (another process?)")
            conn.settimeout(None)
            self._local.conn = conn
        return conn

    def _where(self) -> str:
        return f"the rendezvous store at {self._address[0]}:{self._address[1]}"

    def _call(self, op: int, *args: bytes) -> list[bytes]:
        conn = self._connection()
        try:
            _send_frame(conn, [bytes([op]), *args])
            answer = _read_frame(conn)
        except (OSError, ConnectionError) as exc:
            self._local.conn = None
            conn.close()
            raise dist.DistStoreError(f"{self._where()}: {exc}") from exc
        if answer[0] == bytes([TIMED_OUT]):
            raise dist.DistStoreError(f"{self._where()}: timed out waiting for keys")
        if answer[0] != bytes([OK]):
            raise dist.DistStoreError(f"{self._where()} refused a request: {answer[1:2]!r}")
        return answer[1:]

    def _millis(self, timeout: timedelta | None = None) -> bytes:
        return str(int((timeout or self._wait).total_seconds() * 1000)).encode()

    @staticmethod
    def _bytes(value: Any) -> bytes:
        return value if isinstance(value, bytes) else str(value).encode()

    def set(self, key: str, value: Any) -> None:
        self._call(SET, key.encode(), self._bytes(value))

    def get(self, key: str) -> bytes:
        return self._call(GET, key.encode(), self._millis())[0]

    def add(self, key: str, amount: int) -> int:
        return int(self._call(ADD, key.encode(), str(int(amount)).encode())[0])

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._call(CAS, key.encode(), self._bytes(expected), self._bytes(desired))[0]

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._call(WAIT, self._millis(timeout), *(k.encode() for k in keys))

    def check(self, keys: list[str]) -> bool:
        return self._call(CHECK, *(k.encode() for k in keys))[0] == b"1"

    def delete_key(self, key: str) -> bool:
        return self._call(DELETE, key.encode())[0] == b"1"

    def num_keys(self) -> int:
        return int(self._call(NUM_KEYS)[0])

    # The names torch's C++ side calls these by (its trampoline overrides them by their C++ names).
    deleteKey = delete_key
    getNumKeys = num_keys

    def clone(self) -> GatedStore:
        """Another client of the same store with connections of its own (gloo asks for one per group). Kept
        here: torch holds only the C++ half, and the Python half that answers for it must outlive it."""
        twin = GatedStore(*self._address, self._key, self._wait, self.server)
        self._clones.append(twin)
        return twin

    def set_timeout(self, timeout: timedelta) -> None:
        self._wait = timeout

    def has_extended_api(self) -> bool:
        return False  # no append, multi_get, multi_set or queues: callers fall back to the plain operations
