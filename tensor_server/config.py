"""Settings for ``python -m tensor_server serve``: a TOML file, overridden by flags.

Example (every key optional)::

    roots = ["/data/microscopy"]
    host = "127.0.0.1"
    port = 8815
    token = "s3cret"            # required when host is not a loopback address

    [cache]
    dir = "/var/cache/tensor-server"
    max_bytes = 4294967296      # file-tier budget
    source_scaled_reads = true  # build coarse levels from cached full-resolution chunks

    [pyramid]                   # computed levels advertised for tensors without stored ones
    plane_budget_px = 4194304   # halve Y/X until a plane fits this many pixels
    volume_budget_voxels = 89915392  # then one XYZ level to fit this volume (448**3)

    [catalog]
    rescan_seconds = 0          # periodic rescan of the roots; 0 = off

    [read]
    workers = 0                 # units a scaled read decodes ahead (a shared pool); 0 = the cores

    [log]
    level = "warning"
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tensor_server.errors import InvalidArgument

__all__ = ["Settings", "load_settings", "default_cache_dir"]


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tensor-server"


@dataclass
class Settings:
    roots: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 8815
    token: str | None = None
    cache_dir: str | None = None
    cache_max_bytes: int = 4 << 30
    source_scaled_reads: bool = True
    write_dir: str | None = None
    plane_budget_px: int = 4 * 1024 * 1024
    volume_budget_voxels: int = 448**3
    rescan_seconds: float = 0.0
    read_workers: int = 0
    log_level: str = "warning"


# TOML key path -> Settings attribute
_KEYS = {
    ("roots",): "roots",
    ("host",): "host",
    ("port",): "port",
    ("token",): "token",
    ("write_dir",): "write_dir",
    ("cache", "dir"): "cache_dir",
    ("cache", "max_bytes"): "cache_max_bytes",
    ("cache", "source_scaled_reads"): "source_scaled_reads",
    ("pyramid", "plane_budget_px"): "plane_budget_px",
    ("pyramid", "volume_budget_voxels"): "volume_budget_voxels",
    ("catalog", "rescan_seconds"): "rescan_seconds",
    ("read", "workers"): "read_workers",
    ("log", "level"): "log_level",
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
        if value is None or (name == "roots" and not value):
            continue
        if not hasattr(s, name):
            raise InvalidArgument(f"unknown setting {name!r}")
        setattr(s, name, value)
    if isinstance(s.roots, str):
        s.roots = [s.roots]
    if isinstance(s.read_workers, bool) or not isinstance(s.read_workers, int) or s.read_workers < 0:
        raise InvalidArgument(f"read workers must be an integer >= 0 (0 = the cores), got {s.read_workers!r}")
    return s
