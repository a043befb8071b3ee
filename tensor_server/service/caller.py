"""Who is asking: what a door knows of the client, handed to every service verb.

A door fills it from its transport (Flight: the ``authorization`` header and the gRPC peer;
HTTP: the header or ``?token=`` and the socket peer); the service alone decides what it may
do. Doors never compare tokens themselves.
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tensor_server.errors import InvalidArgument

if TYPE_CHECKING:  # pragma: no cover
    from tensor_server.config import Settings

__all__ = ["Caller", "IN_PROCESS", "peer_is_loopback", "is_loopback_host", "check_bind_address"]


def peer_is_loopback(peer: str) -> bool:
    """gRPC peer strings (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``, ``unix:...``) and
    bare addresses (``127.0.0.1``, ``::1``)."""
    if peer.startswith("unix:"):
        return True
    kind, sep, rest = peer.partition(":")
    host = rest.rsplit(":", 1)[0].strip("[]") if sep and kind in ("ipv4", "ipv6") else peer.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Caller:
    """``token``: the credential presented (None: none); ``peer``: the client's address as
    the door names it, used to count reads per client and to offer the localhost fast path."""

    token: str | None = None
    peer: str = ""
    door: str = "in-process"

    @property
    def is_loopback(self) -> bool:
        return self.door == "in-process" or peer_is_loopback(self.peer)


#: the caller of in-process use (tests, benchmarks, a producer in the server's process)
IN_PROCESS = Caller()


def is_loopback_host(host: str) -> bool:
    """Whether a bind address (or a name) reaches only this machine."""
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
        except OSError:
            return False


def check_bind_address(host: str, settings: Settings) -> None:
    """The rule every door applies before it listens: a non-loopback bind without a token
    would expose every file under the roots to the network, so it is refused."""
    if not is_loopback_host(host) and not settings.token:
        raise InvalidArgument(f"refusing to bind {host}: a non-loopback address needs --token (or bind 127.0.0.1)")
