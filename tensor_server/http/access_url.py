"""The URL a viewer opens, with the HTTP door's per-run access token in it, and the small file
through which ``python -m tensor_server url`` learns that token from the running server.

The token rides as a path prefix, ``<base>/t/<token>/zarr/<id>/``: zarr clients (zarr-python
over fsspec, neuroglancer, napari-ome-zarr, vizarr) join their keys onto the URL path, so a
prefix reaches every sub-request, where a ``?token=`` query would be cut off or mangled
(``.../?token=X/.zattrs``). The server writes ``<home>/http/<port>.json`` (mode 0600: it holds
the token) when its HTTP door starts and removes it when it stops; ``url`` reads it by port.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from tensor_server.http.security import TOKEN_PATH_PREFIX

__all__ = ["viewer_url", "write_url_file", "read_url_file", "url_file", "door_security", "mint_access_token"]


def viewer_url(base: str, token: str | None, flavour: str, array_id: str) -> str:
    """``<base>[/t/<token>]/<flavour>/<array_id>/`` (flavour ``zarr`` or ``zarr3``)."""
    prefix = f"{TOKEN_PATH_PREFIX}{token}" if token else ""
    return f"{base.rstrip('/')}{prefix}/{flavour}/{array_id.strip('/')}/"


def url_file(home: Path, port: int) -> Path:
    return Path(home) / "http" / f"{int(port)}.json"


def write_url_file(home: Path, port: int, base: str, token: str | None) -> Path:
    """Record the running door's base URL and token for ``url`` (owner-only, atomic)."""
    path = url_file(home, port)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": base, "token": token, "pid": os.getpid()}, f)
    os.replace(tmp, path)
    return path


def read_url_file(home: Path, port: int) -> dict | None:
    """What a server on ``port`` recorded, or None when none did (or the file is unreadable:
    ``url`` then prints a URL without the token and says why)."""
    try:
        data = json.loads(url_file(home, port).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        return None
    return data


def mint_access_token() -> str:
    """A per-run access token of the HTTP door (printed in its URLs; full access, like the
    server token: ``ServingRuntime(access_tokens=...)``)."""
    import secrets

    return secrets.token_urlsafe(24)


def door_security(runtime, *, access_token: str | None, bind_host: str, sans=(), allowed_hosts=(),
                  cors_origins=()):
    """The HttpSecurity of a server's HTTP door: the per-run access token (or the server's
    ``--token``) on every request, any other credential of the runtime (a tensor's grant)
    let through for the runtime to judge. Host names allowed beyond loopback: the host's own
    names and addresses, ``--san`` names, the bind address and ``[http] allowed_hosts`` (a
    rebinding page's name is none of these)."""
    from tensor_server.http.security import HttpSecurity
    from tensor_server.service.tls import host_names

    dns, ips = host_names(sans)
    hosts = [*dns, *ips, *allowed_hosts] + ([bind_host] if bind_host not in ("0.0.0.0", "::", "") else [])
    return HttpSecurity.build(tokens=[access_token, runtime.settings.token], allowed_hosts=hosts,
                              cors_origins=cors_origins, recognizes=runtime.access.recognizes)
