"""Which URLs this server may fetch, and the ``[remote]`` settings every remote read follows.

A URL reaches the server from a client (``add_source("https://...")``) as easily as from the
operator, so a server that fetched any URL could be turned against its own network: asked
for ``http://169.254.169.254/`` (a cloud's metadata service, which hands out credentials),
``http://127.0.0.1:6379/`` or a printer's admin page, it would fetch what the client cannot
reach and report what it found in its errors. So, by default:

* only ``https://``, ``http://`` and ``s3://`` URLs;
* the host is resolved and **every** address it resolves to is checked: a loopback,
  link-local (the metadata address among them), private, shared (CGNAT), multicast,
  reserved or unspecified address refuses the URL, naming the address and this reason;
* the connection then goes to the address that was checked (``_url_fetch.py``), never to a
  second lookup a hostile DNS server could answer differently;
* a redirect is followed only to the same host (and re-checked); to another host only when
  that host is in ``allowed_hosts``.

``allowed_hosts`` (``[remote] allowed_hosts``): when given, only those hosts (``name``,
``name:port`` or ``*.domain``); a listed host may resolve to a private address (the lab's
own server, or a test's loopback server), since the operator named it.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from tensor_server.errors import InvalidArgument, PermissionDenied

__all__ = ["RemoteSettings", "checked_addresses", "remote_settings", "set_remote_settings", "url_scheme"]

SCHEMES = ("https", "http", "s3")
#: the cloud metadata address, named in its own refusal (the one worth a sentence of its own)
METADATA_ADDRESS = ipaddress.ip_address("169.254.169.254")


@dataclass(frozen=True)
class RemoteSettings:
    """The ``[remote]`` section (``config.py``): the host rule, deadlines and the byte cache."""

    allowed_hosts: tuple[str, ...] = ()
    #: seconds a connection or a stalled response may take before the read gives up
    timeout: float = 20.0
    #: a cached object is revalidated (one conditional request) at most this often
    revalidate_seconds: float = 600.0
    #: fetches in flight at once to one host (the rest wait their turn)
    per_host: int = 8
    #: the raw-byte cache (``_remote_bytes.py``); None: in memory only, for this process
    cache_dir: str | None = None
    cache_max_bytes: int = 2 << 30
    follow_redirects: int = 5
    #: a single answer larger than this is refused (a hostile URL must not fill the memory;
    #: zarr reads a whole shard in one answer when a read covers it)
    max_object_bytes: int = 1 << 30
    #: hosts the operator listed as roots: trusted as allowed_hosts are (never a client's URL)
    operator_hosts: tuple[str, ...] = field(default=())

    def allows_listed(self, host: str, port: int | None) -> bool:
        """Whether ``host`` (and port) is in ``allowed_hosts`` or the operator's roots."""
        host = host.lower().rstrip(".")
        for entry in (*self.allowed_hosts, *self.operator_hosts):
            entry = entry.lower()
            name, _, want_port = entry.partition(":") if not entry.startswith("[") else (entry, "", "")
            if want_port and port is not None and str(port) != want_port:
                continue
            if name == host or (name.startswith("*.") and host.endswith(name[1:])):
                return True
        return False

    def cache_path(self) -> Path | None:
        return None if self.cache_dir is None else Path(self.cache_dir)


_lock = threading.Lock()
_current = RemoteSettings()


def set_remote_settings(settings: RemoteSettings) -> RemoteSettings:
    """Install ``settings`` for every remote read of this process (the server does it once
    at start, tests around a case); returns the ones replaced."""
    global _current
    with _lock:
        old, _current = _current, settings
    from tensor_server.adapters._remote_bytes import reset_remote_bytes

    reset_remote_bytes()
    return old


def remote_settings() -> RemoteSettings:
    return _current


def url_scheme(url: str) -> str:
    """The scheme of ``url`` (lower case); InvalidArgument naming it unless https/http/s3."""
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        raise InvalidArgument(
            f"{url[:200]}: the {scheme or 'missing'} scheme is not served; remote images are opened by "
            "https://, http:// or s3:// URL"
        )
    return scheme


def checked_addresses(url: str, settings: RemoteSettings | None = None) -> list[str]:
    """The addresses ``url``'s host resolves to, every one checked against the host rule (the
    module docstring); PermissionDenied naming the host, the address and the reason."""
    settings = settings or remote_settings()
    parts = urlsplit(url)
    host = parts.hostname or ""
    if "@" in parts.netloc:
        raise InvalidArgument(
            f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path[:200]}: a URL with credentials "
            "(user:password@) is refused: this server does not send them, and they would show in errors and logs"
        )
    if not host:
        raise InvalidArgument(f"{url[:200]}: no host in the URL")
    listed = settings.allows_listed(host, parts.port)
    if settings.allowed_hosts and not listed:
        raise PermissionDenied(
            f"{url[:200]}: host {host} is not in [remote] allowed_hosts ({', '.join(settings.allowed_hosts[:5])})"
        )
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise InvalidArgument(f"{url[:200]}: cannot resolve host {host}: {exc}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not listed:
        for address in addresses:
            why = _private_reason(ipaddress.ip_address(address.partition("%")[0]))
            if why is not None:
                raise PermissionDenied(
                    f"{url[:200]}: host {host} resolves to {address}, {why}; a server must not be turned "
                    "against its own network, so such hosts are refused unless listed in [remote] allowed_hosts"
                )
    return addresses


def _private_reason(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why ``ip`` is not a public address, or None when it is."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip == METADATA_ADDRESS:
        return "the cloud metadata address (it hands out the machine's credentials)"
    for test, why in (
        (ip.is_loopback, "a loopback address (this machine)"),
        (ip.is_link_local, "a link-local address"),
        (ip.is_private, "a private address (this machine's network)"),
        (ip.is_multicast, "a multicast address"),
        (ip.is_unspecified, "the unspecified address"),
        (ip.is_reserved, "a reserved address"),
        (not ip.is_global, "not a public address"),
    ):
        if test:
            return why
    return None
