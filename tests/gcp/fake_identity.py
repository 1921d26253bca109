"""Google's side of instance identity tokens, offline: a signing key of the test's own, its JWKS and PEM
certificates (the two documents Google serves), and tokens shaped as the metadata server's ``format=full``."""

from __future__ import annotations

import base64
import datetime
import json
import time
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

ISSUER = "https://accounts.google.com"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@dataclass
class FakeGoogle:
    """Signs identity tokens with a key only this test has; publishes it as Google publishes theirs."""

    key: rsa.RSAPrivateKey = field(default_factory=new_key)
    kid: str = "fake-google-key-1"

    def jwks(self) -> dict[str, Any]:
        numbers = self.key.public_key().public_numbers()
        n = numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")
        e = numbers.e.to_bytes((numbers.e.bit_length() + 7) // 8, "big")
        return {"keys": [{"kty": "RSA", "alg": "RS256", "use": "sig", "kid": self.kid, "n": b64(n), "e": b64(e)}]}

    def certificate_pem(self) -> str:
        """A self-signed certificate of the key (``oauth2/v1/certs`` maps key ids to such PEMs)."""
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-google")])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(1)
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .sign(self.key, hashes.SHA256())
        )
        return certificate.public_bytes(serialization.Encoding.PEM).decode()

    def token(
        self,
        audience: str,
        name: str,
        instance_id: str,
        *,
        project: str = "spotmorph-test",
        zone: str = "us-central1-a",
        issued: float | None = None,
        lifetime: float = 3600.0,
        key: rsa.RSAPrivateKey | None = None,
        header: dict[str, Any] | None = None,
        claims: dict[str, Any] | None = None,
    ) -> str:
        """A token as ``.../identity?audience=AUDIENCE&format=full`` gives VM ``name``; keyword arguments forge it."""
        now = time.time() if issued is None else issued
        body: dict[str, Any] = {
            "aud": audience,
            "azp": "1234567890",
            "email": "spotmorph-worker@spotmorph-test.iam.gserviceaccount.com",
            "email_verified": True,
            "exp": int(now + lifetime),
            "iat": int(now),
            "iss": ISSUER,
            "sub": "1234567890",
            "google": {
                "compute_engine": {
                    "instance_creation_timestamp": int(now) - 60,
                    "instance_id": instance_id,
                    "instance_name": name,
                    "project_id": project,
                    "project_number": 123456789012,
                    "zone": zone,
                }
            },
            **(claims or {}),
        }
        head = {"alg": "RS256", "kid": self.kid, "typ": "JWT", **(header or {})}
        signing = f"{b64(json.dumps(head).encode())}.{b64(json.dumps(body).encode())}"
        signature = (key or self.key).sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing}.{b64(signature)}"
