"""Development TLS material for a broker: a private CA, a server certificate, client certificates.

Made with ``cryptography`` (ECDSA P-256 keys, SHA-256 signatures). The CA signs a server
certificate whose Subject Alternative Names are the host names and IP addresses agents
dial (``localhost`` and ``127.0.0.1`` by default), and optionally client certificates
(for brokers set up to require them). Agents trust the CA: its PEM is handed to them at
enrolment (``EnrolResponse.broker_ca``) or with ``--broker-ca``.

Files written by :func:`write_tls_dir` (keys 0600, certificates 0644)::

    ca.crt  ca.key            the CA; re-used when present, so agents keep trusting it
    server.crt  server.key    the broker's certificate, re-issued on every call
    coordinator.crt/.key      the coordinator's HTTPS certificate (``meshfl coordinator tls``)
    client-NAME.crt/.key      optional client certificates

Validity: the CA :data:`CA_DAYS` (10 years), issued certificates :data:`LEAF_DAYS` (825
days, the longest that Apple platforms accept for a TLS server certificate). This is a
development CA: in production use certificates from the organisation's CA or ACME.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker.passwords import validate_username
from meshfl.errors import ConfigError
from meshfl.files import atomic_write

__all__ = [
    "CA_DAYS",
    "DEFAULT_HOSTS",
    "LEAF_DAYS",
    "CertificateAuthority",
    "TlsFiles",
    "write_pem",
    "write_tls_dir",
]

CA_DAYS = 3650
"""Days a new development CA is valid (10 years)."""

LEAF_DAYS = 825
"""Days an issued server or client certificate is valid."""

DEFAULT_HOSTS = ("localhost", "127.0.0.1")
"""Subject Alternative Names of the server certificate when no host is given."""

_BACKDATE = datetime.timedelta(minutes=5)  # tolerate small clock skew between machines


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "meshfl"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not host or any(c in host for c in " /:@"):
        raise ConfigError(f"invalid host {host!r} for the certificate; pass a DNS name or an IP")
    return x509.DNSName(host)


class CertificateAuthority:
    """A CA key and its self-signed certificate, which sign server and client certificates.

    Parameters
    ----------
    key : ec.EllipticCurvePrivateKey
        The CA's private key.
    cert : x509.Certificate
        The CA's certificate (``BasicConstraints(ca=True)``).

    """

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self.key = key
        self.cert = cert

    @classmethod
    def create(
        cls, common_name: str = "meshfl development CA", *, days: int = CA_DAYS
    ) -> CertificateAuthority:
        """Make a new CA: an ECDSA P-256 key and a self-signed certificate valid ``days`` days."""
        key = ec.generate_private_key(ec.SECP256R1())
        name = _name(common_name)
        now = _now()
        usage = x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False,
        )  # fmt: skip
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(usage, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    @classmethod
    def load(cls, cert_path: Path, key_path: Path) -> CertificateAuthority:
        """Read a CA written by :meth:`save`.

        Raises
        ------
        ConfigError
            A file is missing, unreadable, not PEM, or the key is not an EC key.

        """
        try:
            cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
            key = serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot read the CA {cert_path} / {key_path} ({exc}); remove both to make a new CA"
            ) from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ConfigError(f"{key_path} is not an EC key; remove the CA files to make a new CA")
        return cls(key, cert)

    def save(self, cert_path: Path, key_path: Path) -> None:
        """Write the certificate (0644) and the unencrypted private key (0600) as PEM."""
        write_pem(cert_path, self.cert.public_bytes(serialization.Encoding.PEM), secret=False)
        write_pem(key_path, _key_pem(self.key), secret=True)

    @property
    def pem(self) -> str:
        """The CA certificate as PEM text (what agents are given to trust)."""
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    def issue(
        self,
        common_name: str,
        *,
        hosts: Sequence[str] = (),
        client: bool = False,
        days: int = LEAF_DAYS,
    ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        """Issue a certificate signed by this CA.

        Parameters
        ----------
        common_name : str
            Subject CN: the broker's name, or the client's MQTT username.
        hosts : sequence of str
            DNS names and IP addresses put in the Subject Alternative Name (what TLS
            clients check); required for a server certificate.
        client : bool, default False
            Issue a client certificate (``clientAuth``) instead of a server one.
        days : int, default LEAF_DAYS
            Validity in days.

        Returns
        -------
        tuple
            The new private key and its certificate.

        Raises
        ------
        ConfigError
            A server certificate without hosts, or an invalid host.

        """
        if not client and not hosts:
            raise ConfigError("a server certificate needs at least one host; pass --host NAME")
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), False
            )
        )
        if hosts:
            names = [_san(h) for h in dict.fromkeys(hosts)]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return key, builder.sign(self.key, hashes.SHA256())


@dataclass(frozen=True)
class TlsFiles:
    """Paths of the TLS material in one directory (see the module docstring)."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def write_pem(path: Path, data: bytes, *, secret: bool) -> None:
    """Write PEM ``data`` atomically: mode 0600 when ``secret``, else 0644."""
    try:
        atomic_write(path, lambda f: f.write(data), mode=0o600 if secret else 0o644)
    except OSError as exc:
        raise ConfigError(f"cannot write {path} ({exc.strerror}); check --out") from None


def write_tls_dir(
    out: Path,
    hosts: Iterable[str] = DEFAULT_HOSTS,
    *,
    clients: Iterable[str] = (),
    days: int = LEAF_DAYS,
    server: str = "server",
) -> TlsFiles:
    """Write a broker's development TLS material into ``out`` (created if missing).

    An existing ``ca.crt``/``ca.key`` pair is re-used (agents that trust it keep working);
    otherwise a new CA is made. The server certificate is always issued anew.

    Parameters
    ----------
    out : Path
        Target directory.
    hosts : iterable of str, default ("localhost", "127.0.0.1")
        DNS names and IPs agents use to reach the broker (the server certificate's SAN).
    clients : iterable of str, default ()
        Names (MQTT usernames) to issue client certificates for: ``client-NAME.crt/.key``.
    days : int, default LEAF_DAYS
        Validity of the issued certificates in days.
    server : str, default "server"
        Stem of the server certificate's files, ``{server}.crt``/``{server}.key``:
        ``"coordinator"`` for the coordinator's HTTPS certificate (``meshfl coordinator
        tls``), issued by the same CA as the broker's so devices trust one CA for both.

    Returns
    -------
    TlsFiles
        The paths written.

    Raises
    ------
    ConfigError
        A file cannot be written, an existing CA cannot be read, or a host is invalid.

    """
    out = Path(out)
    if server not in ("server", "coordinator"):
        raise ConfigError(f"server {server!r}: use 'server' (a broker) or 'coordinator'")
    files = TlsFiles(out / "ca.crt", out / "ca.key", out / f"{server}.crt", out / f"{server}.key")
    if files.ca_cert.exists() and files.ca_key.exists():
        ca = CertificateAuthority.load(files.ca_cert, files.ca_key)
    else:
        ca = CertificateAuthority.create()
        ca.save(files.ca_cert, files.ca_key)
    hosts = list(hosts)
    key, cert = ca.issue(hosts[0] if hosts else f"meshfl {server}", hosts=hosts, days=days)
    write_pem(files.server_cert, cert.public_bytes(serialization.Encoding.PEM), secret=False)
    write_pem(files.server_key, _key_pem(key), secret=True)
    for name in clients:
        key, cert = ca.issue(validate_username(name), client=True, days=days)
        pem = cert.public_bytes(serialization.Encoding.PEM)
        write_pem(out / f"client-{name}.crt", pem, secret=False)
        write_pem(out / f"client-{name}.key", _key_pem(key), secret=True)
    return files
