"""The URL a viewer opens, with the HTTP door's access token in it; the token file that keeps
that token across restarts; and the small file through which ``python -m tensor_server url``
learns the running server's URL and token.

The token rides as a path prefix, ``<base>/t/<token>/zarr/<id>/``: zarr clients (zarr-python
over fsspec, neuroglancer, napari-ome-zarr, vizarr) join their keys onto the URL path, so a
prefix reaches every sub-request, where a ``?token=`` query would be cut off or mangled
(``.../?token=X/.zattrs``). The server writes ``<home>/http/<port>.json`` (mode 0600: it holds
the token) when its HTTP door starts and removes it when it stops; ``url`` reads it by port.

The token is kept in ``<home>/http/token`` (mode 0600) and read again at the next start, so a
bookmark, a script or a viewer URL outlives a restart (issue 40: a per-run token broke them
all). ``--rotate-http-token``, or deleting the file, makes a new one; so does a file other
users can read (the token may have leaked) or one that does not hold a token.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from tensor_server.http.credentials import TOKEN_PATH_PREFIX

__all__ = [
    "viewer_url",
    "page_url",
    "write_url_file",
    "read_url_file",
    "url_file",
    "door_security",
    "mint_access_token",
    "stored_access_token",
    "token_file",
]

#: what a kept token may be: ``mint_access_token``'s alphabet, long enough to be unguessable
_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,256}")


def viewer_url(base: str, token: str | None, flavour: str, array_id: str) -> str:
    """``<base>[/t/<token>]/<flavour>/<array_id>/`` (flavour ``zarr`` or ``zarr3``)."""
    prefix = f"{TOKEN_PATH_PREFIX}{token}" if token else ""
    return f"{base.rstrip('/')}{prefix}/{flavour}/{array_id.strip('/')}/"


def page_url(base: str, token: str | None) -> str:
    """The catalog page: ``<base>[/t/<token>]/``."""
    return f"{base.rstrip('/')}{f'{TOKEN_PATH_PREFIX}{token}' if token else ''}/"


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
    """A new access token of the HTTP door (printed in its URLs; full access, like the server
    token: ``ServingRuntime(access_tokens=...)``)."""
    import secrets

    return secrets.token_urlsafe(24)


def token_file(home: Path) -> Path:
    return Path(home) / "http" / "token"


def stored_access_token(home: Path, *, rotate: bool = False) -> tuple[str, str | None]:
    """(the HTTP door's access token, why it is new or None): the one kept in ``token_file``
    when it is there, private and well formed and ``rotate`` is not asked; otherwise a new
    one, written there (0600) before it is returned. A first token is linked into place, so
    two servers starting together on a fresh home agree on one; a replaced one is swapped in
    whole (``os.replace``): a reader never sees half a token."""
    path = token_file(home)
    kept, why = (None, "asked by --rotate-http-token") if rotate else _kept_token(path)
    if kept is not None:
        return kept, None
    token = mint_access_token()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
        f.flush()
        os.fsync(f.fileno())
    try:
        if os.path.lexists(path):
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # only where there is still none
    except FileExistsError:  # another server made one a moment ago: use that one
        return stored_access_token(home)
    except OSError:  # a file system without hard links
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return token, why


def _kept_token(path: Path) -> tuple[str | None, str]:
    """(the token kept in ``path``, "") or (None, why there is none to use)."""
    try:
        st = path.stat()
        kept = path.read_text().strip()
    except FileNotFoundError:
        return None, "none was kept"
    except OSError as exc:
        return None, f"the kept one is unreadable: {exc.strerror}"
    if st.st_mode & 0o077:
        return None, f"the kept one was readable by other users (mode {st.st_mode & 0o777:04o})"
    if not _TOKEN.fullmatch(kept):
        return None, "the file did not hold one"
    return kept, ""


def door_security(runtime, *, access_token: str | None, bind_host: str, sans=(), allowed_hosts=(), cors_origins=()):
    """The HttpSecurity of a server's HTTP door: its access token (or the server's
    ``--token``) on every request, any other credential of the runtime (a tensor's grant)
    let through for the runtime to judge. Host names allowed beyond loopback: the host's own
    names and addresses, ``--san`` names, the bind address and ``[http] allowed_hosts`` (a
    rebinding page's name is none of these)."""
    from tensor_server.http.security import HttpSecurity
    from tensor_server.service.tls import host_names

    dns, ips = host_names(sans)
    hosts = [*dns, *ips, *allowed_hosts] + ([bind_host] if bind_host not in ("0.0.0.0", "::", "") else [])
    return HttpSecurity.build(
        tokens=[access_token, runtime.settings.token],
        allowed_hosts=hosts,
        cors_origins=cors_origins,
        recognizes=runtime.access.recognizes,
    )
