"""Who is asking: what a door knows of the client, handed to every service verb.

A door fills it from its transport (Flight: the ``authorization`` header and the gRPC peer;
HTTP: the header or ``?token=`` and the socket peer); the service alone decides what it may
do. Doors never compare tokens themselves.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["Caller", "IN_PROCESS", "peer_is_loopback"]


@lru_cache(maxsize=4096)
def peer_is_loopback(peer: str) -> bool:
    """gRPC peer strings (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``, ``unix:...``) and
    bare addresses (``127.0.0.1``, ``::1``). Remembered per peer (a connection's every call
    asks; ``ipaddress`` parses in 10-20 us)."""
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
    the door names it, used to count reads per client and to offer the localhost fast path;
    ``door_requires_credential``: the door let the caller in only with a credential (the HTTP
    door with its access token): in local mode too, what is open to anyone without a grant
    then needs a full-access credential, so a tensor's grant read through that door reads its
    tensor and nothing else (``Access.control``)."""

    token: str | None = None
    peer: str = ""
    door: str = "in-process"
    door_requires_credential: bool = False

    @property
    def is_loopback(self) -> bool:
        return self.door == "in-process" or peer_is_loopback(self.peer)


#: the caller of in-process use (tests, benchmarks, a producer in the server's process)
IN_PROCESS = Caller()
