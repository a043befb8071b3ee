"""Settings for ``python -m tensor_server serve``: a TOML file, overridden by flags.

Example (every key optional)::

    roots = ["/data/microscopy"]
    host = "127.0.0.1"
    port = 8815
    token = "s3cret"            # required when host is not a loopback address
    write_dir = "/data/results" # uploaded tensors and the scratch source (see [uploads])

    [cache]
    dir = "/var/cache/tensor-server"  # default: <cache home>/chunks, or chunks-<port> if taken
    max_bytes = 4294967296      # file-tier budget
    source_scaled_reads = true  # build coarse levels from cached full-resolution chunks

    [read]
    special_chunks = true       # blocks the metadata says hold one value: closed form, no decode

    [pyramid]                   # computed levels advertised for tensors without stored ones
    plane_budget_px = 4194304   # Flight: halve Y/X until a plane fits this many pixels
    volume_budget_voxels = 89915392  # then one XYZ level to fit this volume (448**3)
    coarsest_tile = 512         # OME-Zarr, IIIF, DeepZoom, export: halve Y/X down to one tile

    [catalog]
    rescan_seconds = 0          # periodic rescan of the roots; 0 = off
    follow_symlinks_outside_roots = false  # serve symlinks whose targets leave the roots
    open_timeout_seconds = 60   # a source slower to open becomes an unreadable row

    [montage]                   # a plate's wells, a file's positions as one image
    gap = 0.0625                # between wells/positions, a fraction of a cell (0 to 1)

    [annotations]               # ROI annotations (the ``rois`` table), kept across restarts
    path = "/var/lib/tensor-server/annotations.duckdb"  # default: <data home>/annotations.duckdb

    [shares]                    # share links (service/shares.py): their secret and list
    dir = "/var/lib/tensor-server/shares"  # default: <data home>/shares

    [auth]                      # OIDC sign-in tokens as bearer tokens (service/oidc.py)
    oidc_issuer = "https://login.lab.example/realms/lab"   # the tokens' iss
    oidc_audience = "tensor-server"                        # their aud
    oidc_jwks_url = "https://login.lab.example/realms/lab/protocol/openid-connect/certs"
    oidc_jwks_file = "/etc/tensor-server/jwks.json"        # or the keys in a file
    oidc_leeway = 60                                       # seconds of clock skew allowed
    oidc_groups_claim = "groups"                           # the claim folder rules read groups from

    [[auth.rules]]              # with rules, a sign-in reads only its groups' folders (docs/security.md)
    group = "lab-a"             # a group in that claim, or a scope (scope / scp)
    folder = "lab-a"            # a catalog folder (as the catalog page shows it); "" = everything
    access = "read"             # or "write": annotations, uploads, share links; on "" also administers


    [uploads]                   # needs the top-level write_dir = "/data/results" (never discovered)
    writable = true             # serve the Flight write verbs (needs write_dir)
    upload_ttl = 3600           # idle PENDING uploads and tombstones are swept after this
    scratch_ttl = 86400         # caps every lifetime on the scratch source; 0 = off

Where a server keeps its files when none are given: the cache home is
``$XDG_CACHE_HOME/tensor-server`` (``~/.cache/tensor-server``: the demo dataset and chunk
caches), the data home ``$XDG_DATA_HOME/tensor-server`` (``~/.local/share/tensor-server``:
annotations). ``TENSOR_SERVER_HOME`` puts both in one folder instead (``make run`` uses
``.tensor-server`` in the repository, so ``make clean`` removes it).

    [read]
    workers = 0                 # units a scaled read decodes ahead (a shared pool); 0 = the cores

    [log]
    level = "warning"

    [http]                      # OME-Zarr over HTTP (/zarr/<array_id>/, /zarr3/<array_id>/)
    port = 8816                 # absent = off (``run`` turns it on at 8816)

    [cache]
    precache_bytes = 67108864   # warmed after each client read (neighbours, next levels); 0 = off

    [read]
    max_computes = 0            # chunk computations at once (0 = the machine's cores x 2)
    admission_timeout = 30.0    # seconds a computation may wait for a slot, then UNAVAILABLE

    [tls]                       # both doors (docs/security.md)
    enabled = false             # a self-signed certificate minted once in the cache home
    cert = "/etc/tensor-server/cert.pem"  # or the operator's pair (implies enabled)
    key = "/etc/tensor-server/key.pem"
    sans = ["viewer.lab"]       # extra names clients dial (certificate SANs and allowed HTTP Hosts)
    insecure = false            # serve plaintext off loopback anyway (the token travels in clear)

    [http]
    token = true                # an access token on every HTTP request, even on loopback (kept in <home>/http/token)
    cors_origins = ["https://viewer.example"]  # origins that may read without the token
    allowed_hosts = ["tensors.lab"]            # Host names beyond loopback, the host's own and sans
    [metrics]                   # Prometheus /metrics on its own listener (docs/operating.md)
    port = 8817                 # absent = off (``run`` turns it on at 8817)
    host = "127.0.0.1"          # off loopback it needs the token (every scrape presents it)

    [remote]                    # images opened by URL (https://, http://, s3://: docs/beyond-one-machine.md)
    allowed_hosts = ["data.lab.org", "*.example.org"]  # only these hosts (default: any public host)
    timeout = 20.0              # seconds a remote request may take, then UNAVAILABLE naming the URL
    revalidate_seconds = 600    # a cached remote object is checked (one HEAD) at most this often
    per_host = 8                # requests in flight at once to one host
    cache_dir = "/var/cache/tensor-server/remote"  # the raw-byte cache (default: <cache home>/remote)
    cache_max_bytes = 2147483648
    max_object_bytes = 1073741824  # one larger answer is refused (never read whole)

    [log]
    format = "text"             # or "json": one object per line (the request log too)
    requests = "-"              # the request log: a file, "-" (stderr) or "off" (absent: serve "-", run a file)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensor_server.core.montage import DEFAULT_GAP_FRACTION, check_gap_fraction
from tensor_server.errors import InvalidArgument

__all__ = [
    "Settings",
    "load_settings",
    "default_cache_dir",
    "default_data_dir",
    "keep_home_files_private",
    "PRIVATE_UMASK",
]

#: the umask a server runs under: what it writes (the catalog, the annotations, cached pixels,
#: the TLS key, the HTTP access token, uploads, exports) is its user's only, files 0600 and
#: folders 0700. A umask, not a mode at each creation point: DuckDB, zarr and tifffile create
#: files (and DuckDB its write-ahead log, later) with the process's umask and take no mode
PRIVATE_UMASK = 0o077


def default_cache_dir() -> Path:
    """Where regenerable files go (demo data, chunk caches)."""
    if os.environ.get("TENSOR_SERVER_HOME"):
        return Path(os.environ["TENSOR_SERVER_HOME"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tensor-server"


def default_data_dir() -> Path:
    """Where user data goes (annotations): not a cache, so not under the cache home."""
    if os.environ.get("TENSOR_SERVER_HOME"):
        return Path(os.environ["TENSOR_SERVER_HOME"])
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "tensor-server"


def keep_home_files_private() -> list[str]:
    """Set the process umask to ``PRIVATE_UMASK`` for the rest of the process (a server's
    process: ``serve`` calls this once, before it writes anything) and make the cache and data
    homes 0700 when they do not exist yet. Returns a warning for each home that exists open
    to other users (an older server made it 0755): files written there before this umask may
    be readable by them. A home is not narrowed here: ``TENSOR_SERVER_HOME`` may name a
    folder the user shares on purpose, or ``/tmp``; the warning names the fix."""
    os.umask(PRIVATE_UMASK)
    warnings = []
    for home in dict.fromkeys((default_cache_dir(), default_data_dir())):
        try:
            home.mkdir(parents=True, exist_ok=True, mode=0o700)
            mode = home.stat().st_mode & 0o777
        except OSError:  # the store or cache that needs it says why, with its flag
            continue
        if mode & 0o077:
            warnings.append(
                f"WARNING: the server home {home} is open to other users (mode {mode:04o}): what an "
                f"earlier server wrote there (catalog, annotations, cached pixels) may be readable by "
                f"them. Fix: chmod -R go-rwx {home}"
            )
    return warnings


@dataclass
class Settings:
    """Every setting of a server, built once (by the command line, from the TOML file and
    the flags) and handed to the serving runtime; a door reads only its own transport
    fields (``host``, ``port``, ``http_port``; the metrics door ``metrics_host``,
    ``metrics_port``)."""

    roots: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 8815
    token: str | None = None
    cache_dir: str | None = None
    cache_max_bytes: int = 4 << 30
    source_scaled_reads: bool = True
    special_chunks: bool = True
    write_dir: str | None = None
    rois_path: str | None = None
    #: the share links' secret and list (``service/shares.py``); None: in memory (tests)
    shares_dir: str | None = None
    #: OIDC sign-in tokens (``service/oidc.py``): off while ``oidc_issuer`` is None
    oidc_issuer: str | None = None
    oidc_audience: str | None = None
    oidc_jwks_url: str | None = None
    oidc_jwks_file: str | None = None
    oidc_leeway: float = 60.0
    oidc_groups_claim: str = "groups"
    #: ``[[auth.rules]]`` as written (``service/oidc.py``'s ``parse_rules`` checks them at start)
    oidc_rules: list[dict[str, Any]] = field(default_factory=list)
    writable: bool = False
    upload_ttl: float = 3600.0
    scratch_ttl: float = 86400.0
    plane_budget_px: int = 4 * 1024 * 1024
    volume_budget_voxels: int = 448**3
    coarsest_tile: int = 512
    rescan_seconds: float = 0.0
    follow_symlinks_outside_roots: bool = False
    open_timeout_seconds: float = 60.0
    #: the gap between a plate's wells or a file's positions in their montage (core/montage.py)
    montage_gap: float = DEFAULT_GAP_FRACTION
    read_workers: int = 0
    log_level: str = "warning"
    http_port: int | None = None
    precache_bytes: int = 64 << 20
    max_computes: int = 0
    admission_timeout: float = 30.0
    # transport and browser safety (service/tls.py, http/security.py)
    tls: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    sans: list[str] = field(default_factory=list)
    insecure: bool = False
    http_token: bool = True
    cors_origins: list[str] = field(default_factory=list)
    http_allowed_hosts: list[str] = field(default_factory=list)
    #: refuse every verb that writes anything (uploads, added sources, annotations)
    read_only: bool = False
    #: serve add_source / remove_source (``--no-add-source`` turns them off)
    add_source: bool = True
    #: folders an added path must lie under (None: the user's home and the served roots)
    allowed_paths: list[str] | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    log_format: str = "text"
    #: where the request log goes: a file, "-" (stderr) or "off"; None: serve's stderr, run's file
    request_log: str | None = None
    # images opened by URL (adapters/_url_rules.py, adapters/_remote_bytes.py)
    remote_allowed_hosts: list[str] = field(default_factory=list)
    remote_timeout: float = 20.0
    remote_revalidate_seconds: float = 600.0
    remote_per_host: int = 8
    remote_cache_dir: str | None = None
    remote_cache_max_bytes: int = 2 << 30
    remote_max_object_bytes: int = 1 << 30

    def pyramid_policy(self):  # core.pyramid.PyramidPolicy
        """The computed levels advertised for tensors without stored ones."""
        from tensor_server.core.pyramid import PyramidPolicy

        return PyramidPolicy(self.plane_budget_px, self.volume_budget_voxels, coarsest_tile=self.coarsest_tile)

    def admission_bound(self) -> int:
        """Chunk computations at once: ``max_computes``, 0 meaning twice the cores."""
        return self.max_computes or 2 * (os.cpu_count() or 1)


# TOML key path -> Settings attribute
_KEYS = {
    ("roots",): "roots",
    ("host",): "host",
    ("port",): "port",
    ("token",): "token",
    ("write_dir",): "write_dir",
    ("uploads", "writable"): "writable",
    ("uploads", "upload_ttl"): "upload_ttl",
    ("uploads", "scratch_ttl"): "scratch_ttl",
    ("cache", "dir"): "cache_dir",
    ("cache", "max_bytes"): "cache_max_bytes",
    ("cache", "source_scaled_reads"): "source_scaled_reads",
    ("read", "special_chunks"): "special_chunks",
    ("pyramid", "plane_budget_px"): "plane_budget_px",
    ("pyramid", "volume_budget_voxels"): "volume_budget_voxels",
    ("pyramid", "coarsest_tile"): "coarsest_tile",
    ("catalog", "rescan_seconds"): "rescan_seconds",
    ("catalog", "follow_symlinks_outside_roots"): "follow_symlinks_outside_roots",
    ("catalog", "open_timeout_seconds"): "open_timeout_seconds",
    ("montage", "gap"): "montage_gap",
    ("annotations", "path"): "rois_path",
    ("shares", "dir"): "shares_dir",
    ("auth", "oidc_issuer"): "oidc_issuer",
    ("auth", "oidc_audience"): "oidc_audience",
    ("auth", "oidc_jwks_url"): "oidc_jwks_url",
    ("auth", "oidc_jwks_file"): "oidc_jwks_file",
    ("auth", "oidc_leeway"): "oidc_leeway",
    ("auth", "oidc_groups_claim"): "oidc_groups_claim",
    ("auth", "rules"): "oidc_rules",
    ("read", "workers"): "read_workers",
    ("log", "level"): "log_level",
    ("http", "port"): "http_port",
    ("cache", "precache_bytes"): "precache_bytes",
    ("read", "max_computes"): "max_computes",
    ("read", "admission_timeout"): "admission_timeout",
    ("read_only",): "read_only",
    ("catalog", "add_source"): "add_source",
    ("catalog", "allowed_paths"): "allowed_paths",
    ("tls", "enabled"): "tls",
    ("tls", "cert"): "tls_cert",
    ("tls", "key"): "tls_key",
    ("tls", "sans"): "sans",
    ("tls", "insecure"): "insecure",
    ("http", "token"): "http_token",
    ("http", "cors_origins"): "cors_origins",
    ("http", "allowed_hosts"): "http_allowed_hosts",
    ("metrics", "port"): "metrics_port",
    ("metrics", "host"): "metrics_host",
    ("log", "format"): "log_format",
    ("log", "requests"): "request_log",
    ("remote", "allowed_hosts"): "remote_allowed_hosts",
    ("remote", "timeout"): "remote_timeout",
    ("remote", "revalidate_seconds"): "remote_revalidate_seconds",
    ("remote", "per_host"): "remote_per_host",
    ("remote", "cache_dir"): "remote_cache_dir",
    ("remote", "cache_max_bytes"): "remote_cache_max_bytes",
    ("remote", "max_object_bytes"): "remote_max_object_bytes",
}


def _flatten(d: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, prefix + (k,)))
        else:
            out[prefix + (k,)] = v
    return out


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Settings from ``config_file`` (TOML), then ``overrides`` (flags; None = not given)."""
    import tomllib

    s = Settings()
    if config_file is not None:
        path = Path(config_file)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidArgument(f"{path}: cannot read config: {exc}") from None
        flat = _flatten(data)
        unknown = [".".join(k) for k in flat if k not in _KEYS]
        if unknown:
            raise InvalidArgument(f"{path}: unknown config keys {unknown}; known: {sorted('.'.join(k) for k in _KEYS)}")
        for key, value in flat.items():
            setattr(s, _KEYS[key], value)
    for name, value in overrides.items():
        if value is None or (name in ("roots", "sans", "cors_origins") and not value):
            continue
        if not hasattr(s, name):
            raise InvalidArgument(f"unknown setting {name!r}")
        setattr(s, name, value)
    if isinstance(s.roots, str):
        s.roots = [s.roots]
    if isinstance(s.read_workers, bool) or not isinstance(s.read_workers, int) or s.read_workers < 0:
        raise InvalidArgument(f"read workers must be an integer >= 0 (0 = the cores), got {s.read_workers!r}")
    s.log_level = _log_level(s.log_level)
    s.montage_gap = check_gap_fraction(s.montage_gap)
    if s.log_format not in ("text", "json"):
        raise InvalidArgument(f"log format must be 'text' or 'json', got {s.log_format!r}")
    return s


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _log_level(value: Any) -> str:
    """The log level, lower case; anything else is refused (a typo must not silence the log)."""
    level = value.lower() if isinstance(value, str) else value
    if level not in LOG_LEVELS:
        raise InvalidArgument(f"log level must be one of {', '.join(LOG_LEVELS)}; got {value!r}")
    return level
