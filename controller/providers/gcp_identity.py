"""GCP instance identity tokens: the JWT Google signs for a VM, checked with ``cryptography`` alone.

A VM asks its metadata server for ``instance/service-accounts/default/identity?audience=A&format=full`` and
gets a JWT (RS256) signed by Google whose ``google.compute_engine`` claims name it: project, zone, instance
id and name. Nobody else can make one, and the audience ties it to this controller, so it proves which VM
asks. Checked here: the header (RS256 and a key id among Google's keys), the signature, the issuer, the
audience, ``exp`` and ``iat`` (with a little leeway), and the claims' shape; whether the instance belongs
to the group is the provider's question. Tokens and key documents are read as hostile: sizes are capped,
every field's type is checked, and nothing of them is logged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from controller.files import PEM_LIMIT, read_small
from controller.providers.identity import IdentityRefused, IdentityUnavailable

log = logging.getLogger("spotmorph.controller.gcp")

MAX_TOKEN = 8 << 10  # a full-format identity token is about 1 KiB
MAX_KEYS = 64
KEYS_LIMIT = 1 << 20
ISSUERS = frozenset({"https://accounts.google.com", "accounts.google.com"})
LEEWAY_SECONDS = 30.0  # clocks differ a little; a token is valid for an hour
REFETCH_SECONDS = 60.0  # an unknown key id refetches the keys at most this often
FETCH_TIMEOUT_SECONDS = 10.0
_B64URL = re.compile(r"^[A-Za-z0-9_-]*$")
_DIGITS = re.compile(r"^[0-9]{1,20}$")


class KeysUnavailable(IdentityUnavailable):
    """Google's keys could not be fetched or read (none known yet): the VM asks again later."""


@dataclass(frozen=True)
class InstanceIdentity:
    """Who a verified token says the VM is (``google.compute_engine``)."""

    project: str
    zone: str
    instance_id: str
    instance_name: str


def _b64(part: str, what: str) -> bytes:
    if not _B64URL.match(part):
        raise IdentityRefused(f"not a JWT: its {what} is not base64url")
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise IdentityRefused(f"not a JWT: its {what} is not base64url") from None


def _object(part: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(_b64(part, what))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise IdentityRefused(f"not a JWT: its {what} is not JSON") from None
    if not isinstance(value, dict):
        raise IdentityRefused(f"not a JWT: its {what} is not a JSON object")
    return value


def key_id(token: str) -> str:
    """The id of the key a token says it is signed with ("" when it names none); refuses what is no RS256 JWT."""
    if not token or len(token) > MAX_TOKEN or token.count(".") != 2:
        raise IdentityRefused("not a JWT (three base64url parts, at most 8 KiB)")
    header = _object(token.split(".")[0], "header")
    if header.get("alg") != "RS256":
        raise IdentityRefused(f"signed with {str(header.get('alg'))[:20]!r}, not RS256")
    kid = header.get("kid", "")
    if not isinstance(kid, str) or len(kid) > 128:
        raise IdentityRefused("its key id is not a short string")
    return kid


def verify(token: str, key: rsa.RSAPublicKey, audience: str, now: float) -> InstanceIdentity:
    """The instance a token signed with ``key`` names; raises IdentityRefused saying what is wrong."""
    key_id(token)
    header, payload, signature = token.split(".")
    try:
        key.verify(_b64(signature, "signature"), f"{header}.{payload}".encode(), padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        raise IdentityRefused("its signature is not Google's") from None
    claims = _object(payload, "claims")
    if claims.get("iss") not in ISSUERS:
        raise IdentityRefused("not issued by Google (iss)")
    aud = claims.get("aud")
    if aud != audience and not (isinstance(aud, list) and audience in aud):
        raise IdentityRefused(f"issued for another audience (this controller's is {audience!r})")
    expires, issued = _time(claims, "exp"), _time(claims, "iat")
    if now > expires + LEEWAY_SECONDS:
        raise IdentityRefused("expired (ask the metadata server for a new one)")
    if issued > now + LEEWAY_SECONDS:
        raise IdentityRefused("issued in the future (is this VM's or the controller's clock wrong?)")
    google = claims.get("google")
    engine = google.get("compute_engine") if isinstance(google, dict) else None
    if not isinstance(engine, dict):
        raise IdentityRefused("no google.compute_engine claims (ask for the token with format=full)")
    values = {k: engine.get(k) for k in ("project_id", "zone", "instance_id", "instance_name")}
    if not all(isinstance(v, str) and 0 < len(v) <= 128 for v in values.values()):
        raise IdentityRefused("google.compute_engine lacks project_id, zone, instance_id or instance_name")
    if not _DIGITS.match(str(values["instance_id"])):
        raise IdentityRefused("google.compute_engine.instance_id is not a number")
    return InstanceIdentity(*(str(values[k]) for k in ("project_id", "zone", "instance_id", "instance_name")))


def _time(claims: Mapping[str, Any], name: str) -> float:
    value = claims.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise IdentityRefused(f"its {name} is not a time")
    return float(value)


def parse_keys(body: bytes) -> dict[str, rsa.RSAPublicKey]:
    """RSA keys by id from a JWKS (``{"keys": [...]}``), a JSON map of key id to PEM certificate (Google's
    ``oauth2/v1/certs``), or PEM (one certificate or public key, id ""). Raises ValueError."""
    if body.lstrip().startswith(b"-----BEGIN"):
        return {"": _pem_key(body)}
    document = json.loads(body)
    if not isinstance(document, dict):
        raise ValueError("neither a JWKS nor a map of key ids to certificates")
    keys: dict[str, rsa.RSAPublicKey] = {}
    if isinstance(document.get("keys"), list):
        for jwk in document["keys"][:MAX_KEYS]:
            if isinstance(jwk, dict) and jwk.get("kty") == "RSA" and isinstance(jwk.get("kid"), str):
                keys[jwk["kid"]] = _jwk_key(jwk)
    else:
        for kid, pem in list(document.items())[:MAX_KEYS]:
            if isinstance(pem, str):
                keys[str(kid)] = _pem_key(pem.encode())
    if not keys:
        raise ValueError("no RSA keys in it")
    return keys


def _jwk_key(jwk: Mapping[str, Any]) -> rsa.RSAPublicKey:
    n, e = jwk.get("n"), jwk.get("e")
    if not (isinstance(n, str) and isinstance(e, str) and len(n) <= 2048 and len(e) <= 16):
        raise ValueError(f"key {str(jwk.get('kid'))[:40]!r}: n and e are not short base64url strings")
    modulus = int.from_bytes(_b64_key(n), "big")
    exponent = int.from_bytes(_b64_key(e), "big")
    return rsa.RSAPublicNumbers(exponent, modulus).public_key()


def _b64_key(value: str) -> bytes:
    try:
        return _b64(value, "key")
    except IdentityRefused:
        raise ValueError("a key's n or e is not base64url") from None


def _pem_key(pem: bytes) -> rsa.RSAPublicKey:
    key = (
        x509.load_pem_x509_certificate(pem).public_key()
        if b"CERTIFICATE" in pem[:64]
        else serialization.load_pem_public_key(pem)
    )
    if not isinstance(key, rsa.RSAPublicKey):
        raise ValueError("not an RSA key")
    return key


def fetch(source: str) -> bytes:
    """The key document at ``source`` (a URL or a file), at most 1 MiB."""
    if "://" not in source:
        return read_small(Path(source), "identity_certs", PEM_LIMIT)
    request = urllib.request.Request(source, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_SECONDS) as response:  # https, or loopback
        body: bytes = response.read(KEYS_LIMIT + 1)
    if len(body) > KEYS_LIMIT:
        raise ValueError(f"more than {KEYS_LIMIT} bytes")
    return body


class SigningKeys:
    """Google's signing keys, fetched from ``source`` (off the event loop) and kept ``refresh_seconds``."""

    def __init__(
        self,
        source: str,
        refresh_seconds: float,
        wall: Callable[[], float],
        run: Callable[[Callable[[], bytes]], Awaitable[bytes]],
    ) -> None:
        self.source = source
        self.refresh_seconds = refresh_seconds
        self.wall = wall
        self.run = run  # runs a blocking call in a thread
        self.keys: dict[str, rsa.RSAPublicKey] = {}
        self.fetched_at = float("-inf")
        self._lock = asyncio.Lock()

    async def get(self, kid: str) -> rsa.RSAPublicKey:
        """The key ``kid`` names (a PEM source's only key for any id); IdentityRefused for an unknown one."""
        now = self.wall()
        stale = now >= self.fetched_at + self.refresh_seconds
        if stale or (kid not in self.keys and now >= self.fetched_at + REFETCH_SECONDS):
            await self._fetch(now)
        key = self.keys.get(kid) or self.keys.get("")
        if key is None:
            raise IdentityRefused(f"signed with a key Google does not list ({kid[:40]!r})")
        return key

    async def _fetch(self, now: float) -> None:
        async with self._lock:
            if self.fetched_at == now:
                return
            try:
                self.keys = parse_keys(await self.run(lambda: fetch(self.source)))
            except Exception as exc:  # a hostile or broken answer keeps the keys known so far
                log.warning("identity_certs %s: %s", self.source, " ".join(str(exc).split())[:200])
                self.fetched_at = now - self.refresh_seconds + REFETCH_SECONDS  # tried again in a minute
                if not self.keys:
                    raise KeysUnavailable(f"cannot read the signing keys at {self.source}") from None
                return
            self.fetched_at = now
