"""The client side: find the controller and the token, open an authenticated channel.

Address: ``--controller``, else ``SPOTMORPH_CONTROLLER``, else the context file ``spotmorph local up``
writes (see :mod:`controller.client.context`). Token:
``--token``, else ``SPOTMORPH_TOKEN``, else that file. grpc is imported here, never by a command
module at import time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import grpc

from controller.client.context import read_context
from controller.files import PEM_LIMIT, read_small
from morphing.errors import UserInputError


def resolve(controller: str | None, token: str | None) -> tuple[str, str | None]:
    context = read_context()
    address = controller or os.environ.get("SPOTMORPH_CONTROLLER") or (context.controller if context else None)
    if not address:
        raise UserInputError(
            "no controller: pass --controller HOST:PORT, set SPOTMORPH_CONTROLLER or `spotmorph local up`"
        )
    return address, token or os.environ.get("SPOTMORPH_TOKEN") or (context.token() if context else None)


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self.header = ("authorization", f"Bearer {token}")

    def _with_token(self, details: Any) -> Any:
        return details._replace(metadata=[*(details.metadata or []), self.header])

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)


def channel(
    address: str, token: str | None, ca: Path | None = None, cert: Path | None = None, key: Path | None = None
) -> grpc.Channel:
    """A channel that sends the bearer token with every call; TLS (mutual with cert/key) when ``ca`` is given."""
    if ca is not None:
        credentials = grpc.ssl_channel_credentials(
            read_small(ca, "--tls-ca", PEM_LIMIT),
            read_small(key, "--tls-key", PEM_LIMIT) if key else None,
            read_small(cert, "--tls-cert", PEM_LIMIT) if cert else None,
        )
        raw = grpc.secure_channel(address, credentials)
    else:
        raw = grpc.insecure_channel(address)
    return grpc.intercept_channel(raw, _Bearer(token)) if token else raw
