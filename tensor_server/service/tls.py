"""TLS for both doors, transport-free: the certificate a server presents and the rule that
decides whether it may serve without one.

A server on a network sends its bearer token and every pixel in cleartext unless it speaks
TLS. The biopb SDK trusts a self-signed leaf by pinning it (trust on first use, or a
``tls_fingerprint=`` the user copies from this server's start-up line), so the server needs
no CA: :func:`server_tls` loads ``--tls-cert/--tls-key``, or mints a self-signed leaf once in
the server home and reuses it on every later start (re-minting would break every client's
pin). The leaf's subject-alternative names are every name a client may dial — ``localhost``,
the loopback addresses, the hostname, the host's addresses, plus ``--san NAME`` — because
gRPC checks the dialed name even against a pinned anchor.

Flight serves it with ``grpc+tls://`` (pyarrow's ``tls_certificates``), HTTP with uvicorn's
``ssl_certfile/ssl_keyfile``; both take what :class:`ServerTls` holds. ``cryptography`` is
imported only here, and only when a server uses TLS.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import logging
import os
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensor_server.errors import FailedPrecondition, InvalidArgument

__all__ = [
    "ServerTls",
    "server_tls",
    "host_names",
    "canonical_name",
    "fingerprint",
    "format_fingerprint",
    "expiry_warning",
    "key_mode_warning",
    "require_safe_transport",
    "is_loopback_host",
    "VALIDITY_DAYS",
    "EXPIRY_WARN_DAYS",
]

log = logging.getLogger(__name__)

#: total span of a minted certificate: long, because a new certificate breaks every pin
VALIDITY_DAYS = 825
#: how long before the end the server starts warning at every start
EXPIRY_WARN_DAYS = 30
#: a resolver that cannot answer about this host's own name may not stall the start
_NAME_PROBE_SECONDS = 3.0

_CERT_FILE, _KEY_FILE = "server-cert.pem", "server-key.pem"


@dataclass(frozen=True)
class ServerTls:
    """The certificate and key a server presents (PEM), where they are on disk (uvicorn reads
    files), and what a client pins: the SHA-256 of the certificate's DER."""

    cert_pem: bytes
    key_pem: bytes
    cert_path: Path
    key_path: Path
    fingerprint: str
    not_after: datetime.datetime
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    minted: bool  # self-signed by this server (False: the operator's --tls-cert)
    key_mode: int = 0o600  # the key file's permission bits when it was read

    def health(self) -> dict[str, object]:
        """What ``health`` reports, so a user can pin the certificate it saw."""
        return {
            "tls": True,
            "tls_fingerprint": self.fingerprint,
            "tls_not_after": self.not_after.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }

    def startup_lines(self) -> list[str]:
        """What the server prints at start: the fingerprint to pin and any expiry warning."""
        origin = "self-signed, " + str(self.cert_path) if self.minted else str(self.cert_path)
        lines = [
            f"TLS certificate ({origin}), SHA-256 fingerprint {format_fingerprint(self.fingerprint)}",
            f"  pin it: TensorFlightClient('grpcs://HOST:PORT', tls_fingerprint='{self.fingerprint}')",
        ]
        for warning in (expiry_warning(self.not_after), key_mode_warning(self.key_path, self.key_mode)):
            if warning:
                lines.append(warning)
        return lines


def fingerprint(cert_pem: bytes) -> str:
    """SHA-256 of the first certificate's DER, lowercase hex: what the SDK's TOFU pin and its
    ``tls_fingerprint=`` compare (they accept this or the colon-grouped form)."""
    text = cert_pem.decode("ascii", "replace")
    end = text.find("-----END CERTIFICATE-----")
    if end < 0:
        raise InvalidArgument("the TLS certificate holds no PEM 'CERTIFICATE' block; pass a PEM file to --tls-cert")
    der = ssl.PEM_cert_to_DER_cert(text[: end + len("-----END CERTIFICATE-----")] + "\n")
    return hashlib.sha256(der).hexdigest()


def format_fingerprint(hex_digest: str) -> str:
    """``AB:CD:...``, the form people compare by eye."""
    return ":".join(hex_digest[i : i + 2].upper() for i in range(0, len(hex_digest), 2))


def expiry_warning(not_after: datetime.datetime, now: datetime.datetime | None = None) -> str | None:
    """A sentence when the certificate has expired or ends within EXPIRY_WARN_DAYS, else None.
    A pinned certificate is still checked against its end date, and the SDK then reports only
    a failed connection, so the server says it first."""
    now = now or datetime.datetime.now(datetime.UTC)
    left = not_after - now
    stamp = not_after.strftime("%Y-%m-%d")
    fix = (
        "delete the certificate and key files so the server mints a new one (or pass a renewed "
        "--tls-cert/--tls-key); every client must then re-pin it"
    )
    if left.total_seconds() <= 0:
        return f"WARNING: the TLS certificate expired on {stamp}; clients cannot connect. To proceed, {fix}."
    if left.days < EXPIRY_WARN_DAYS:
        return f"WARNING: the TLS certificate expires on {stamp} ({left.days} days); before then, {fix}."
    return None


def key_mode_warning(key_path: Path, mode: int) -> str | None:
    """A sentence when the private key file is open to other users (any group or other
    permission bit), else None: whoever reads it can impersonate this server to every
    client that pinned it. The server still serves it (it is the operator's file)."""
    if not mode & 0o077:
        return None
    return (
        f"WARNING: the TLS private key {key_path} is readable by other users of this machine (mode "
        f"{mode & 0o777:04o}); whoever reads it can impersonate this server. Fix: chmod 600 {key_path}"
    )


def is_loopback_host(host: str) -> bool:
    """Whether a bind address (or name) only reaches this machine."""
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
        except OSError:
            return False


def require_safe_transport(host: str, settings: Any, tls: object | None) -> None:
    """The rules every door applies before it listens, in one place. Off loopback: a server
    without a token would expose every file under its roots to the network (refused), and one
    without TLS (``tls`` None or false) would send the token and the pixels in cleartext
    (refused unless ``--insecure``). Each refusal says why and how to proceed."""
    if is_loopback_host(host):
        return
    if not settings.token:
        raise InvalidArgument(f"refusing to bind {host}: a non-loopback address needs --token (or bind 127.0.0.1)")
    if tls or settings.insecure:
        return
    raise FailedPrecondition(
        f"refusing to serve on {host} without TLS: off loopback the bearer token and every pixel would "
        "travel in cleartext, readable by anyone on the network path. Pass --tls (a self-signed certificate "
        "minted once in the server home; clients pin its fingerprint) or --tls-cert FILE --tls-key FILE, "
        "or --insecure to serve plaintext anyway (a trusted network only)"
    )


def _bounded(probe, default):
    """``probe()`` or ``default`` when it fails or takes longer than _NAME_PROBE_SECONDS
    (getfqdn/getaddrinfo block in libc with no timeout; a thinner SAN list beats no server)."""
    out = [default]

    def run() -> None:
        try:
            out[0] = probe()
        except OSError:
            pass

    worker = threading.Thread(target=run, name="tls-name-probe", daemon=True)
    worker.start()
    worker.join(_NAME_PROBE_SECONDS)
    return out[0]


def host_names(extra: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) a client may dial this host by: localhost, the loopback
    addresses, the hostname and FQDN, the outbound address, what the hostname resolves to,
    then ``extra`` (``--san``; an IP literal becomes an IP name)."""
    dns, ips = ["localhost"], ["127.0.0.1", "::1"]
    hostname = socket.gethostname()
    for name in (hostname, _bounded(socket.getfqdn, "")):
        if name and name not in dns:
            dns.append(name)
    try:  # the outbound interface, without sending a packet
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            ips.append(s.getsockname()[0])
    except OSError:
        pass
    resolved = _bounded(lambda: [info[4][0] for info in socket.getaddrinfo(hostname, None)], [])
    ips += resolved
    for value in extra:
        name, is_ip = canonical_name(value)
        if name:
            (ips if is_ip else dns).append(name)
    return list(dict.fromkeys(dns)), list(dict.fromkeys(ip.split("%", 1)[0] for ip in ips))


def canonical_name(value: str) -> tuple[str, bool]:
    """(the one spelling of a name a client may dial, whether it is an IP address): an IP
    literal in ``ipaddress``'s form (``[::1]``, ``0:0::1`` and ``::1`` are ``::1``; a zone
    ``%eth0`` dropped: a certificate names no zone), a DNS name lower-case without its
    trailing dot (``LOCALHOST`` and ``localhost.`` are ``localhost``). ``("", False)`` for
    a blank. A ``--san`` and a stored certificate's names are compared in this form, so a
    spelling of a name the certificate holds never re-mints it (which breaks every pin)."""
    value = value.strip()
    try:
        return str(ipaddress.ip_address(value.strip("[]").split("%", 1)[0])), True
    except ValueError:
        return value.rstrip(".").lower(), False


def _mint(dns: Sequence[str], ips: Sequence[str], days: int) -> tuple[bytes, bytes]:
    """A self-signed end-entity certificate (ECDSA P-256: a cheap handshake) and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, dns[0] if dns else "localhost"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tensor-server (self-signed)"),
        ]
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)  # clock skew
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _write_private(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` atomically with ``mode`` from the first byte (the key is a secret)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _describe(cert_pem: bytes, key_pem: bytes, cert_path: Path, key_path: Path, minted: bool) -> ServerTls:
    """Parse and check a certificate/key pair (the key must be the certificate's)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise InvalidArgument(f"{cert_path}: not a PEM certificate ({exc}); pass a PEM file to --tls-cert") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(
            f"{key_path}: not an unencrypted PEM private key ({exc}); decrypt it first "
            "(openssl pkey -in KEY -out PLAIN) and pass that to --tls-key"
        ) from None
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, pub) != cert.public_key().public_bytes(
        serialization.Encoding.DER, pub
    ):
        raise InvalidArgument(f"{key_path} is not the private key of {cert_path}; pass the matching pair")
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = tuple(san.get_values_for_type(x509.DNSName))
        ips = tuple(str(a) for a in san.get_values_for_type(x509.IPAddress))
    except x509.ExtensionNotFound:
        dns, ips = (), ()
    try:
        key_mode = os.stat(key_path).st_mode & 0o777
    except OSError:  # read a moment ago: gone since, nothing left to warn about
        key_mode = 0o600
    return ServerTls(
        cert_pem,
        key_pem,
        cert_path,
        key_path,
        fingerprint(cert_pem),
        cert.not_valid_after_utc,
        dns,
        ips,
        minted,
        key_mode,
    )


def _read(path: Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InvalidArgument(
            f"{flag} {path}: cannot read it ({exc.strerror}); the server reads it as the user it runs as"
        ) from None


def server_tls(
    home: Path, *, cert: str | None = None, key: str | None = None, sans: Sequence[str] = (), days: int = VALIDITY_DAYS
) -> ServerTls:
    """The certificate a server presents: ``cert``/``key`` when given (both or neither), else
    the self-signed pair in ``home/tls/``, minted on first use. A stored pair is reused as is
    (a new certificate breaks every pin) unless a ``--san`` name is missing from it: then a
    new one is minted and the warning says the old pins must go."""
    if bool(cert) != bool(key):
        raise InvalidArgument(
            "--tls-cert and --tls-key go together: pass both, or neither for a self-signed certificate"
        )
    if cert and key:
        cert_path, key_path = Path(cert).expanduser(), Path(key).expanduser()
        return _describe(_read(cert_path, "--tls-cert"), _read(key_path, "--tls-key"), cert_path, key_path, False)
    folder = Path(home) / "tls"
    cert_path, key_path = folder / _CERT_FILE, folder / _KEY_FILE
    if cert_path.exists() and key_path.exists():
        stored = _describe(cert_path.read_bytes(), key_path.read_bytes(), cert_path, key_path, True)
        held = {canonical_name(n)[0] for n in stored.dns_names + stored.ip_addresses}
        missing = sorted({canonical_name(n)[0] for n in sans} - held - {""})
        if not missing:
            return stored
        log.warning(
            "the TLS certificate in %s lacks --san %s: minting a new one; clients that pinned %s must clear that pin",
            folder,
            ", ".join(missing),
            stored.fingerprint[:16],
        )
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    dns, ips = host_names(sans)
    cert_pem, key_pem = _mint(dns, ips, days)
    _write_private(key_path, key_pem, 0o600)
    _write_private(cert_path, cert_pem, 0o600)  # public, but the server home is private (docs/security.md)
    log.info("minted a self-signed TLS certificate in %s for %s", folder, dns + ips)
    return _describe(cert_pem, key_pem, cert_path, key_path, True)
