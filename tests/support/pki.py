"""Certificates for tests that run real TLS handshakes on 127.0.0.1: a CA, and server and client certificates
it signed (EC P-256, valid for a day), a chain with an intermediate CA, a renewed client certificate; not
part of the shipped package."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

Key = ec.EllipticCurvePrivateKey
Issuer = tuple[x509.Name, Key]


@dataclass
class Pki:
    """Where `make_pki` wrote the PEM files (`<name>.crt`, `<name>.key` for ca, server and client)."""

    dir: Path
    ca: Path
    client_cert: Path
    client_key: Path

    @property
    def server_cert(self) -> Path:
        """The server certificate (for 127.0.0.1 and localhost)."""
        return self.dir / "server.crt"

    @property
    def server_key(self) -> Path:
        """The server certificate's key."""
        return self.dir / "server.key"


def _cert(
    name: str,
    key: Key,
    issuer: Issuer | None,
    *,
    ca: bool = False,
    valid: dt.timedelta = dt.timedelta(days=1),
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name, issuer_key = issuer if issuer else (subject, key)
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + valid)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        # Python 3.13 verifies with VERIFY_X509_STRICT by default: key usage and both key identifiers.
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=not ca,
                data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
        )
    )
    if not ca:
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(d: Path, name: str, certs: list[x509.Certificate], key: Key) -> None:
    """`<name>.crt` (the certificates in order, PEM) and `<name>.key` in `d`."""
    (d / f"{name}.crt").write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs))
    (d / f"{name}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def make_pki(d: Path) -> Pki:
    """A CA, a server certificate for 127.0.0.1 and localhost and a client certificate, all signed by the CA,
    written to `d`."""

    def write(name: str, cert: x509.Certificate, key: Key) -> None:
        _write(d, name, [cert], key)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("tokwatch-test-ca", ca_key, None, ca=True)
    write("ca", ca, ca_key)
    for name in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        write(name, _cert(name, key, (ca.subject, ca_key)), key)
    return Pki(d, d / "ca.crt", d / "client.crt", d / "client.key")


def client_ssl(pki: Pki, *, with_cert: bool = False) -> ssl.SSLContext:
    """A client context trusting the test CA (and presenting the client certificate when asked)."""
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if with_cert:
        ctx.load_cert_chain(pki.client_cert, pki.client_key)
    return ctx


def server_ssl(pki: Pki) -> ssl.SSLContext:
    """A server context with the test server certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    return ctx


def not_after(path: Path) -> float:
    """Unix time the first certificate in a PEM file expires."""
    return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc.timestamp()


def renew_client(pki: Pki, name: str) -> None:
    """Replace the client certificate and key with a new pair named `name`, signed by the same CA (what a
    certificate rotation does to the files)."""
    ca = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    ca_key = serialization.load_pem_private_key((pki.dir / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    _write(pki.dir, "client", [_cert(name, key, (ca.subject, ca_key))], key)


def make_chain_pki(d: Path, *, intermediate_valid: dt.timedelta) -> Pki:
    """A root CA, an intermediate CA valid for `intermediate_valid` (shorter than the leaf's day, so it is
    the chain's first to expire) and a server certificate it signed: `server.crt` holds leaf then
    intermediate, as a server sends them; `ca.crt` is the root alone."""
    root_key = ec.generate_private_key(ec.SECP256R1())
    root = _cert("tokwatch-test-root", root_key, None, ca=True, valid=dt.timedelta(days=30))
    mid_key = ec.generate_private_key(ec.SECP256R1())
    mid = _cert(
        "tokwatch-test-intermediate", mid_key, (root.subject, root_key), ca=True, valid=intermediate_valid
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = _cert("server", key, (mid.subject, mid_key))
    _write(d, "ca", [root], root_key)
    _write(d, "intermediate", [mid], mid_key)
    _write(d, "server", [leaf, mid], key)
    client_key = ec.generate_private_key(ec.SECP256R1())
    _write(d, "client", [_cert("client", client_key, (root.subject, root_key))], client_key)
    return Pki(d, d / "ca.crt", d / "client.crt", d / "client.key")


def mtls_server_ssl(pki: Pki) -> ssl.SSLContext:
    """A server context that requires a client certificate signed by the test CA (mutual TLS)."""
    ctx = server_ssl(pki)
    ctx.load_verify_locations(cafile=str(pki.ca))
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
