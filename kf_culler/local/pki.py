"""Fresh certificates for a throw-away control plane: a CA, serving and client certificates, SA keys."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


class Authority:
    """A self-signed CA that issues the certificates of one local cluster."""

    def __init__(self, directory: Path, name: str = "kf-culler-local-ca") -> None:
        self.dir = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.pair = Pair(_write(directory / "ca.crt", self.cert.public_bytes(serialization.Encoding.PEM)),
                         _write(directory / "ca.key", _key_pem(self.key)))

    def issue(self, stem: str, common_name: str, organizations: tuple[str, ...] = (),
              server: bool = False, client: bool = False, dns_names: tuple[str, ...] = ()) -> Pair:
        """A key pair signed by this authority; a server's certificate names loopback, and `dns_names` too."""
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = dt.datetime.now(dt.UTC)
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        builder = (
            x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(self.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.DNSName("kubernetes"),
                x509.DNSName("kubernetes.default.svc"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                *(x509.DNSName(n) for n in dns_names),
            ]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return Pair(_write(self.dir / f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM)),
                    _write(self.dir / f"{stem}.key", _key_pem(key)))


def service_account_keys(directory: Path) -> Pair:
    """An RSA key pair for signing and verifying service-account tokens (cert = public key here)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pub = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    return Pair(_write(directory / "sa.pub", pub), _write(directory / "sa.key", _key_pem(key)))
