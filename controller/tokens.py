"""Tokens and who they prove the caller is: roles, node tokens and per-VM agent tokens.

Node tokens are an HMAC of the node's name and incarnation under a secret in the state directory, and
per-VM agent tokens an HMAC of the VM's instance id under a key derived from it, so neither is stored.
No gRPC here: the local cluster and ``spotmorph agent-token`` issue tokens without the server's imports
(``controller.api.auth`` checks them on every call).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from controller.files import TOKEN_LIMIT, read_small_text, write_private
from morphing.errors import UserInputError

NODE_SECRET = "node-secret"  # in the state directory: every node and per-VM token is an HMAC under it
VM_TOKEN_PREFIX = "vm."
# Instance ids a per-VM token may name: Azure VM names, the local cluster's vm-N; they travel in a header.
INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class Role(StrEnum):
    OPERATOR = "operator"
    READER = "reader"
    AGENT = "agent"
    NODE = "node"


@dataclass(frozen=True)
class Principal:
    """Who a token proves the caller is; ``instance``: the VM a per-VM agent token was issued to."""

    role: Role
    node: str | None = None
    incarnation: int | None = None
    instance: str | None = None


def read_or_create_token(path: Path, flag: str = "token file") -> str:
    """The token in ``path``; a new random one (mode 0600) when the file is missing.

    New tokens start with ``smt_`` so that one never begins with ``-``, which a command line would
    take for an option (``--token -abc`` fails to parse).
    """
    if path.exists():
        token = read_small_text(path, flag, TOKEN_LIMIT).strip()
        if token:
            return token
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = "smt_" + secrets.token_urlsafe(32)
    write_private(path, f"{token}\n".encode())
    return token


def token_secret(state_dir: Path) -> bytes:
    """The secret node and per-VM tokens are derived from (created with the state directory)."""
    return read_or_create_token(state_dir / NODE_SECRET, "node secret").encode()


def issue_vm_token(state_dir: Path, instance: str) -> str:
    """The agent token of VM ``instance``, for whoever provisions it (a provider, ``spotmorph agent-token``)."""
    return Tokens({}, token_secret(state_dir)).vm_token(instance)


class Tokens:
    """Static tokens by role, plus node and per-VM agent tokens derived from a secret."""

    def __init__(self, static: Mapping[str, Role], secret: bytes) -> None:
        self.static = dict(static)
        self.secret = secret
        # A key of its own for VM tokens: no node token's MAC can ever be a VM token's.
        self._vm_key = hmac.new(secret, b"spotmorph per-VM agent tokens", hashlib.sha256).digest()
        self._rendezvous_key = hmac.new(secret, b"spotmorph rendezvous keys", hashlib.sha256).digest()

    def node_token(self, node: str, incarnation: int) -> str:
        mac = hmac.new(self.secret, f"{node}\x00{incarnation}".encode(), hashlib.sha256).hexdigest()
        return f"node.{node}.{incarnation}.{mac}"

    def rendezvous_key(self, job: str, generation: int) -> str:
        """The key (64 hex digits) a generation's trainers prove to its rendezvous store: a MAC of the job and
        generation under a key of its own, so that no token's MAC is ever a rendezvous key, nor the reverse."""
        return hmac.new(self._rendezvous_key, f"{job}\0{generation}".encode(), hashlib.sha256).hexdigest()

    def rendezvous_salt(self) -> str:
        """What makes a generation's rendezvous port unpredictable to anyone without this controller's secret."""
        return hmac.new(self._rendezvous_key, b"ports", hashlib.sha256).hexdigest()

    def vm_token(self, instance: str) -> str:
        """The agent token of the VM whose provider instance id is ``instance``."""
        if not INSTANCE_ID.fullmatch(instance):
            raise UserInputError(
                f"instance id {instance[:80]!r}: use letters, digits, '.', '_' or '-' (at most 128, "
                "starting with a letter or digit)"
            )
        mac = hmac.new(self._vm_key, instance.encode(), hashlib.sha256).hexdigest()
        return f"{VM_TOKEN_PREFIX}{instance}.{mac}"

    def identify(self, token: str) -> Principal | None:
        for known, role in self.static.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return Principal(role)
        if token.startswith(VM_TOKEN_PREFIX):
            instance = token[len(VM_TOKEN_PREFIX) :].rpartition(".")[0]
            if INSTANCE_ID.fullmatch(instance) and hmac.compare_digest(
                self.vm_token(instance).encode(), token.encode()
            ):
                return Principal(Role.AGENT, instance=instance)
            return None
        parts = token.removeprefix("node.").rsplit(".", 2)
        if token.startswith("node.") and len(parts) == 3 and parts[1].isdigit() and len(parts[1]) < 19:
            node, incarnation = parts[0], int(parts[1])
            if hmac.compare_digest(self.node_token(node, incarnation).encode(), token.encode()):
                return Principal(Role.NODE, node, incarnation)
        return None
