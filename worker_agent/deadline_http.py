"""One plain-HTTP request under one deadline and a cap on the body (for the link-local metadata service).

urllib's ``timeout`` bounds each socket operation, not the request, so a server that sends a byte a
second keeps a request open for as long as it likes. Here every connect, send and receive waits at
most until a single deadline for the whole request, and the body is read no further than the cap.
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from socket import _Address

    from _typeshed import ReadableBuffer, WriteableBuffer


class RequestFailed(Exception):
    """The request got no usable answer: unreachable, too slow, an error status or an oversized body."""


class _DeadlineSocket(socket.socket):
    """A socket whose every wait ends at the request's deadline, however slowly the peer sends."""

    deadline: float
    clock: Callable[[], float]

    def _arm(self) -> None:
        left = self.deadline - self.clock()
        if not left > 0:
            raise TimeoutError("no complete answer within the request's deadline")
        self.settimeout(left)

    def connect(self, address: _Address) -> None:
        self._arm()
        super().connect(address)

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        self._arm()
        return super().recv_into(buffer, nbytes, flags)

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        self._arm()
        super().sendall(data, flags)


def _open(host: str, port: int, deadline: float, clock: Callable[[], float]) -> _DeadlineSocket:
    problem: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = _DeadlineSocket(family, kind, proto)
        sock.deadline, sock.clock = deadline, clock
        try:
            sock.connect(address)
        except OSError as exc:
            sock.close()
            problem = exc
            continue
        return sock
    raise problem


class _Connection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, deadline: float, clock: Callable[[], float]) -> None:
        super().__init__(host, port)
        self._deadline, self._clock = deadline, clock

    def connect(self) -> None:
        self.sock = _open(self.host, self.port, self._deadline, self._clock)


@dataclass(frozen=True)
class Answer:
    """An HTTP answer of any status: the cloud's metadata services say "nothing scheduled" with a 404 and "your
    token expired" with a 401, and the caller decides what each means."""

    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-cased names

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


def request(
    url: str,
    *,
    timeout: float,
    max_body_bytes: int,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> bytes:
    """The body of a 2xx answer to ``method url``, all of it within ``timeout`` seconds of ``clock``
    (name lookup aside: the metadata service is addressed by IP)."""
    answer = exchange(
        url, timeout=timeout, max_body_bytes=max_body_bytes, method=method, headers=headers, body=body, clock=clock
    )
    if not 200 <= answer.status < 300:
        raise RequestFailed(f"HTTP {answer.status} {answer.header(REASON) or ''!r}")
    return answer.body


REASON = ":reason"  # the status line's reason phrase, kept among the headers under a name no header can have
MAX_HEADER_TEXT = 1000  # of each header value kept


def exchange(
    url: str,
    *,
    timeout: float,
    max_body_bytes: int,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Answer:
    """The answer to ``method url`` whatever its status, under the same deadline and cap as :func:`request`."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise RequestFailed(f"only plain http:// URLs are supported, not {url!r}")
    try:
        port = parts.port or 80
    except ValueError as exc:
        raise RequestFailed(f"bad port in {url!r}") from exc
    target = parts.path or "/"
    if parts.query:
        target = f"{target}?{parts.query}"
    connection = _Connection(parts.hostname, port, clock() + timeout, clock)
    try:
        connection.request(method, target, body=body, headers=dict(headers or {}))
        response = connection.getresponse()
        if response.length is not None and response.length > max_body_bytes:
            raise RequestFailed(f"a body of {response.length} bytes is over the {max_body_bytes}-byte cap")
        data = response.read(max_body_bytes + 1)
        if len(data) > max_body_bytes:
            raise RequestFailed(f"the body is over the {max_body_bytes}-byte cap")
        kept = {name.lower(): value[:MAX_HEADER_TEXT] for name, value in response.getheaders()}
        kept[REASON] = response.reason[:100]
        return Answer(response.status, data, kept)
    except TimeoutError as exc:
        raise RequestFailed(f"no complete answer within {timeout:g} s") from exc
    except OSError as exc:
        raise RequestFailed(f"connection failed: {exc}") from exc
    except http.client.HTTPException as exc:
        raise RequestFailed(f"not a valid HTTP answer: {type(exc).__name__}: {str(exc)[:200]}") from exc
    finally:
        connection.close()
