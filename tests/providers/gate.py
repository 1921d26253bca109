"""A TCP forwarder on loopback in front of a fake cloud's server: while refusing, the cloud is unreachable.

Connections accepted while refusing are reset at once, and those open when it starts refusing are reset too,
so a client sees the same as a cloud it cannot reach (a connection error, never an answer). TLS passes through.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field


@dataclass
class Gate:
    target: tuple[str, int]
    refusing: bool = False
    port: int = 0
    _server: asyncio.Server | None = None
    _live: set[asyncio.StreamWriter] = field(default_factory=set)
    _pumps: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{self.port}"

    def refuse(self, on: bool) -> None:
        self.refusing = on
        if on:
            for writer in list(self._live):
                writer.transport.abort()

    async def stop(self) -> None:
        self.refuse(True)
        if self._server is not None:
            self._server.close()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._live.update((writer, up_writer))
        pumps = [asyncio.ensure_future(_pump(reader, up_writer)), asyncio.ensure_future(_pump(up_reader, writer))]
        self._pumps.update(pumps)
        await asyncio.gather(*pumps, return_exceptions=True)
        self._pumps.difference_update(pumps)
        self._live.difference_update((writer, up_writer))


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
