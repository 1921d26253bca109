"""The server's TLS material, read and checked before anything is created or listens.

Left to grpc, a certificate without its key would mean plaintext, and a missing file or the key of
another certificate a traceback; so the flags are paired, every file parsed and the key matched to
the certificate here, each problem one line naming the flag, the file and the fix (exit code 2).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes

from controller.app.settings import ControllerSettings
from controller.files import PEM_LIMIT, read_small
from morphing.errors import UserInputError

MAKE_THEM = "`spotmorph certs DIR --host NAME` makes a matching set"


@dataclass(frozen=True)
class ServerTls:
    """A certificate with its own key, and the CA client certificates must be signed by (mutual TLS)."""

    cert: Path
    key: Path
    ca: Path | None
    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes | None

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem, require_client_auth=self.ca_pem is not None
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The same rules over HTTPS (metrics): this certificate, and client certificates when there is a CA."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.cert, self.key)
            if self.ca_pem is not None:
                context.load_verify_locations(cadata=self.ca_pem.decode("ascii"))
                context.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise UserInputError(
                f"--tls-cert {self.cert}, --tls-key {self.key}: the metrics' HTTPS cannot load them ({exc}); "
                f"pass a pair OpenSSL reads ({MAKE_THEM})"
            ) from None
        return context


def load_server_tls(settings: ControllerSettings) -> ServerTls | None:
    """None without TLS flags; the checked material with a complete set; UserInputError otherwise."""
    cert, key, ca = settings.tls_cert, settings.tls_key, settings.tls_ca
    if cert is None and key is None:
        if ca is not None:
            raise UserInputError(
                f"--tls-ca {ca} without --tls-cert and --tls-key: client certificates are checked only by a "
                f"TLS server; pass --tls-cert and --tls-key too ({MAKE_THEM}), or drop --tls-ca"
            )
        return None
    if key is None:
        raise UserInputError(
            f"--tls-cert {cert} without --tls-key: TLS needs the certificate's private key; "
            "pass --tls-key FILE, or drop --tls-cert to listen in plaintext on loopback"
        )
    if cert is None:
        raise UserInputError(
            f"--tls-key {key} without --tls-cert: TLS needs the certificate of that key; "
            "pass --tls-cert FILE, or drop --tls-key to listen in plaintext on loopback"
        )
    cert_pem, key_pem = _read("--tls-cert", cert), _read("--tls-key", key)
    certificate = _certificates("--tls-cert", cert, cert_pem)[0]
    if _public(certificate.public_key()) != _public(_private_key(key, key_pem).public_key()):
        raise UserInputError(
            f"--tls-key {key} does not belong to --tls-cert {cert} (their public keys differ); "
            f"pass the key made with that certificate ({MAKE_THEM})"
        )
    ca_pem = None
    if ca is not None:
        ca_pem = _read("--tls-ca", ca)
        _certificates("--tls-ca", ca, ca_pem)
    return ServerTls(cert, key, ca, cert_pem, key_pem, ca_pem)


def _read(flag: str, path: Path) -> bytes:
    return read_small(path, flag, PEM_LIMIT)


def _certificates(flag: str, path: Path, pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise UserInputError(
            f"{flag} {path}: not a PEM certificate (no valid -----BEGIN CERTIFICATE----- block); "
            f"convert a DER one with `openssl x509 -inform der -in {path} -out cert.pem`, or {MAKE_THEM}"
        ) from None


def _private_key(path: Path, pem: bytes) -> PrivateKeyTypes:
    try:
        return serialization.load_pem_private_key(pem, password=None)
    except TypeError:
        raise UserInputError(
            f"--tls-key {path}: the key is encrypted; the controller needs it unencrypted in a file only it can "
            f"read (`openssl pkey -in {path} -out server.key`, then chmod 600)"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise UserInputError(
            f"--tls-key {path}: not a PEM private key (no valid -----BEGIN PRIVATE KEY----- block); "
            f"pass the key of --tls-cert, or {MAKE_THEM}"
        ) from None


def _public(key: PublicKeyTypes) -> bytes:
    """The SubjectPublicKeyInfo of a certificate's or a private key's public key, to compare them."""
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
