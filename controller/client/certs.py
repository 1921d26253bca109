"""A private CA and certificates for one cluster: the controller's server certificate and client ones."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from controller.files import private_dir, write_private, write_public

VALID_DAYS = 825


def _name(common: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "spotmorph"), x509.NameAttribute(NameOID.COMMON_NAME, common)]
    )


def _write(folder: Path, stem: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
    key_bytes = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_private(folder / f"{stem}.key", key_bytes)
    write_public(folder / f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM))


def make_cluster_certs(folder: Path, hosts: list[str], clients: list[str]) -> list[Path]:
    """ca.crt/key, server.crt/key for ``hosts`` (DNS names or IPs), and one pair per client name.

    ``folder`` is made 0700 and the keys 0600 (the CA key signs anything); certificates are 0644.
    """
    private_dir(folder)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("spotmorph cluster CA"))
        .issuer_name(_name("spotmorph cluster CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _write(folder, "ca", ca_key, ca)

    def leaf(stem: str, common: str, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        _write(folder, stem, key, builder.sign(ca_key, hashes.SHA256()))

    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    leaf("server", hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, sans)
    for client in clients:
        leaf(client, client, ExtendedKeyUsageOID.CLIENT_AUTH, [])
    return sorted(folder.iterdir())
