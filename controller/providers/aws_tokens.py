"""Handing an instance its own agent token by SSM Run Command, sealed so that no AWS record holds it.

A Run Command's script stays readable in the command history (``ssm:ListCommands``, 30 days) and in the SSM
agent's files on the instance, so the token never travels in one in the clear. Two commands instead:

1. the instance makes an RSA key (root only, under /etc/spotmorph) and prints its public half;
2. the controller seals the token to that key (RSA-OAEP, SHA-256) and sends the sealed token, which the
   instance opens with ``openssl`` and writes to /etc/spotmorph/agent.token, where the agent waits for it
   (``--wait-for-token``), then deletes the key.

Whoever reads the history sees a public key and a ciphertext; whoever could run commands on the instance was
root there anyway. What the instance prints is treated as hostile: anything but one RSA public key of 2048
to 8192 bits is refused.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Awaitable
from typing import Any, Protocol

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from controller.providers.aws_config import AwsSettings
from controller.providers.aws_scale import error_code

DOCUMENT = "AWS-RunShellScript"
# SPOTMORPH_ETC is unset on a real instance (the SSM agent runs scripts as root with its own environment):
# the tests' fake instances point it at a folder of their own.
KEY_SCRIPT = """set -eu
etc="${SPOTMORPH_ETC:-/etc/spotmorph}"
umask 077
install -d -m 0755 "$etc"
key="$etc/agent-token.key"
[ -s "$key" ] || openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:3072 -out "$key" 2>/dev/null
openssl pkey -in "$key" -pubout
"""
# Written beside, then renamed: the agent never reads half a token. Readable by the agent's group only.
OPEN_SCRIPT = """set -eu
etc="${SPOTMORPH_ETC:-/etc/spotmorph}"
key="$etc/agent-token.key"
umask 027
tmp="$etc/agent.token.new"
printf '%s' '@SEALED@' | openssl base64 -d -A | openssl pkeyutl -decrypt -inkey "$key" \\
  -pkeyopt rsa_padding_mode:oaep -pkeyopt rsa_oaep_md:sha256 -pkeyopt rsa_mgf1_md:sha256 > "$tmp"
printf '\\n' >> "$tmp"
if getent group spotmorph > /dev/null; then chgrp spotmorph "$tmp"; fi
mv -f "$tmp" "$etc/agent.token"
rm -f "$key"
"""
PUBLIC_KEY = re.compile(r"-----BEGIN PUBLIC KEY-----\s+[A-Za-z0-9+/=\s]{200,2000}?-----END PUBLIC KEY-----")
WAITING = frozenset({"Pending", "InProgress", "Delayed"})
OUTPUT_LIMIT = 24_000  # what SSM returns of a command's output at most


class Call(Protocol):
    """The provider's AWS call: off the event loop, with timeouts and retries (``idempotent``: on timeouts too)."""

    def __call__(
        self, service: str, operation: str, arguments: dict[str, Any], idempotent: bool = True
    ) -> Awaitable[Any]: ...


class HandOverFailed(Exception):
    """A step of the hand-over did not end well on the instance (or SSM said something unreadable)."""


def seal(token: str, public_pem: bytes) -> str:
    """``token`` encrypted to ``public_pem`` (RSA-OAEP, SHA-256), in base64: what only the instance can open."""
    key = serialization.load_pem_public_key(public_pem)
    if not isinstance(key, rsa.RSAPublicKey) or not 2048 <= key.key_size <= 8192:
        raise HandOverFailed("the instance's key is not an RSA key of 2048 to 8192 bits")
    oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
    return base64.b64encode(key.encrypt(token.encode(), oaep)).decode()


def public_key(output: str) -> bytes:
    """The one PEM public key in what the first command printed; refused otherwise."""
    found = PUBLIC_KEY.findall(output[:OUTPUT_LIMIT])
    if len(found) != 1:
        raise HandOverFailed(f"the instance printed no public key: {_excerpt(output)}")
    return str(found[0]).encode()


async def hand_over(call: Call, s: AwsSettings, instance_id: str, token: str) -> None:
    """Both commands on ``instance_id``; raises HandOverFailed (or the AWS error as it came)."""
    printed = await run_script(call, s, instance_id, KEY_SCRIPT, "spotmorph agent token: key")
    sealed = seal(token, public_key(printed))
    await run_script(call, s, instance_id, OPEN_SCRIPT.replace("@SEALED@", sealed), "spotmorph agent token: seal")


async def run_script(call: Call, s: AwsSettings, instance_id: str, script: str, comment: str) -> str:
    """Run ``script`` on the instance and wait for it to end; its standard output."""
    timeout = int(s.token_timeout_seconds)
    arguments = {
        "InstanceIds": [instance_id],
        "DocumentName": DOCUMENT,
        "Comment": comment[:100],
        "TimeoutSeconds": max(30, timeout),
        "Parameters": {"commands": [script], "executionTimeout": [str(timeout)]},
    }
    sent = await call("ssm", "send_command", arguments, idempotent=False)
    command_id = _text(_text_field(sent, "Command"), "CommandId")
    deadline = asyncio.get_running_loop().time() + 2 * timeout + 30  # delivery, then execution
    while True:
        invocation = await _invocation(call, command_id, instance_id)
        status = _text(invocation, "Status") if invocation is not None else "Pending"
        if status == "Success":
            return str(invocation.get("StandardOutputContent") or "") if invocation else ""
        if status not in WAITING:
            details = invocation.get("StatusDetails") if invocation else None
            error = invocation.get("StandardErrorContent") if invocation else None
            raise HandOverFailed(f"{comment}: {_excerpt(str(details or status))}: {_excerpt(str(error or ''))}")
        if asyncio.get_running_loop().time() > deadline:
            raise HandOverFailed(f"{comment}: still {status} after {2 * timeout + 30} s")
        await asyncio.sleep(s.token_poll_seconds)


async def _invocation(call: Call, command_id: str, instance_id: str) -> dict[str, Any] | None:
    """The command's invocation on the instance; None while SSM has not made it yet (just after sending)."""
    try:
        found = await call("ssm", "get_command_invocation", {"CommandId": command_id, "InstanceId": instance_id})
    except Exception as exc:
        if error_code(exc) == "InvocationDoesNotExist":
            return None
        raise
    if not isinstance(found, dict):
        raise HandOverFailed("GetCommandInvocation: not an object")
    return found


def _text_field(value: Any, key: str) -> Any:
    if not isinstance(value, dict) or not isinstance(value.get(key), dict):
        raise HandOverFailed(f"SSM's answer has no {key}")
    return value[key]


def _text(value: Any, key: str) -> str:
    found = value.get(key) if isinstance(value, dict) else None
    if not isinstance(found, str) or not found or len(found) > 200:
        raise HandOverFailed(f"SSM's answer has no usable {key}")
    return found


def _excerpt(text: str) -> str:
    return " ".join(text.split())[:200] or "(nothing)"
