"""The commands that look without serving: ``url`` (the URL a viewer opens), ``list`` (what a
root holds, as the catalog would serve it) and ``stats`` (a tensor's or a folder's
statistics). Part of the cli door (``cli.main`` dispatches here); ``roots_present`` is shared
with ``serve``, which refuses roots that are not there the same way ``list`` does.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from tensor_server.cli_logging import ScanProgress, setup_logging

__all__ = ["COMMANDS", "roots_present"]


def roots_present(roots: list[str], command: str = "serve") -> bool:
    """Whether there is a root to serve: a root that does not exist is an error when it is
    the only one, and a loud warning when others exist (the server still starts)."""
    from tensor_server.catalog.remote import is_remote_root

    missing = [r for r in roots if not is_remote_root(r) and not os.path.lexists(r)]
    if missing and len(missing) == len(roots):
        print(
            f"{command}: no such folder or file: {', '.join(missing)}. Give an existing ROOT "
            "(a typo, or a disk that is not mounted?)",
            file=sys.stderr,
        )
        return False
    for r in missing:
        print(f"{command}: WARNING: root {r} does not exist: going on with the other roots", file=sys.stderr)
    return True


def cmd_url(args: argparse.Namespace) -> int:
    """The URL a viewer opens: a file or folder is named by its source id (its default
    tensor), anything else is taken as an array id."""
    from pathlib import Path

    from tensor_server.catalog.catalog import looks_like_path
    from tensor_server.config import default_cache_dir
    from tensor_server.core.identity import source_id_for_path
    from tensor_server.http.access_url import read_url_file, viewer_url

    target = args.target
    if not Path(target).exists() and looks_like_path(target):
        print(
            f"url: {target}: no such file or folder (give an existing path, or an array id as "
            "`tensor-server list ROOT` prints it)",
            file=sys.stderr,
        )
        return 2
    array_id = source_id_for_path(target) if Path(target).exists() else target.strip("/")
    prefix = "zarr" if args.ngff == "0.4" else "zarr3"
    running = read_url_file(default_cache_dir(), args.http_port)  # the access token of the server there
    if running is None:
        print(
            f"url: no server with the home {default_cache_dir()} is serving HTTP on port {args.http_port}, so the "
            "URL carries no access token; for `make run`'s server use `make url TARGET=...` (or set "
            "TENSOR_SERVER_HOME to its home)",
            file=sys.stderr,
        )
    scheme = running["url"].split("://", 1)[0] if running else "http"
    print(viewer_url(f"{scheme}://{args.host}:{args.http_port}", running and running.get("token"), prefix, array_id))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from tensor_server.catalog import Catalog

    setup_logging("error")
    if not roots_present(args.roots, "list"):
        return 2
    catalog = Catalog(args.roots, open_processes=0)  # every source is printed from its adapter: open them here
    unclaimed: list = []
    progress = ScanProgress() if sys.stderr.isatty() else None
    summary = catalog.scan(progress, on_unclaimed=unclaimed.append)
    if progress is not None:
        progress.done(summary)
    tensors = 0
    for rec in catalog.records():
        if rec.source is None:
            print(f"{rec.source_id}  [{rec.type}]  UNREADABLE: {rec.unresolved_reason}")
            continue
        print(f"{rec.source_id}  [{rec.type}]  {rec.path}")
        for t in rec.source.tensors.values():
            tensors += 1
            levels = f", {len(t.native_levels)} stored levels" if t.native_levels else ""
            labels = " labels" if t.is_labels else ""
            print(
                f"    {t.array_id}  {'x'.join(map(str, t.shape))} {''.join(t.dim_labels) if all(len(d) == 1 for d in t.dim_labels) else t.dim_labels} {t.dtype.str}{labels}{levels}"
            )
    _print_skipped(catalog.skipped, unclaimed)
    print(
        f"{summary['total']} sources ({summary['total'] - summary['unresolved']} readable, "
        f"{summary['unresolved']} unreadable), {tensors} tensors; "
        f"{len(catalog.skipped) + len(unclaimed)} files skipped ({len(unclaimed)} not a known format, "
        f"{len(catalog.skipped)} refused)"
    )
    catalog.close()
    return 0


def _print_skipped(refused: list, unclaimed: list) -> None:
    """One SKIPPED line per entry the scan did not serve, with the reason."""
    for path, why in refused:
        print(f"SKIPPED  {path}: {why}")
    for path in unclaimed:
        print(f"SKIPPED  {path}: no format recognises this file (by content or extension)")


def _parse_slice(text: str, ndim: int) -> tuple[slice, ...]:
    from tensor_server.errors import InvalidArgument

    parts = [p.strip() for p in text.split(",")]
    if len(parts) > ndim:
        raise InvalidArgument(f"--slice has {len(parts)} axes, the tensor has {ndim}")
    out = []
    for p in parts:
        a, sep, b = p.partition(":")
        try:
            out.append(slice(int(a) if a else None, int(b) if b else None) if sep else slice(int(a), int(a) + 1))
        except ValueError:
            raise InvalidArgument(f"--slice: {p!r} is not start:stop") from None
        if out[-1].start is not None and out[-1].stop is not None and out[-1].stop <= out[-1].start:
            raise InvalidArgument(f"--slice: {p!r} is empty (stop <= start); give start:stop with stop > start")
    return tuple(out)


def cmd_stats(args: argparse.Namespace) -> int:
    import json

    from tensor_server.adapters.registry import claim_format, open_source
    from tensor_server.core.bounds import Bounds
    from tensor_server.core.engine import ReadEngine
    from tensor_server.core.stats import tensor_stats
    from tensor_server.errors import TensorServerError

    setup_logging("error")
    if Path(args.path).is_dir() and claim_format(Path(args.path)) is None:
        return _stats_under(args)
    engine = ReadEngine(special_chunks=not args.no_special_chunks)
    try:
        with open_source(args.path) as src:
            fields = [args.field] if args.field else list(src.tensors)
            for name in fields:
                t = src.tensor(name)
                bounds = Bounds.from_slices(_parse_slice(args.slice, t.ndim), t.shape) if args.slice else None
                print(json.dumps({"field": name, **tensor_stats(t, bounds, engine)}))
    except TensorServerError as exc:
        print(f"stats: {exc}", file=sys.stderr)
        return 2
    return 0


def _stats_under(args: argparse.Namespace) -> int:
    """``stats`` of a folder that is not one dataset: every source the catalog finds under it (as
    ``list`` does), one line per tensor with its source's path. 1 when a source was unreadable,
    2 when no tensor was found."""
    import json

    from tensor_server.catalog import Catalog
    from tensor_server.core.bounds import Bounds
    from tensor_server.core.engine import ReadEngine
    from tensor_server.core.stats import tensor_stats
    from tensor_server.errors import TensorServerError

    engine = ReadEngine(special_chunks=not args.no_special_chunks)
    catalog = Catalog([args.path], open_processes=0)
    catalog.scan()
    printed, unreadable = 0, 0
    try:
        for rec in sorted(catalog.records(), key=lambda r: str(r.path)):
            if rec.source is None:
                unreadable += 1
                print(f"stats: {rec.path}: unreadable: {rec.unresolved_reason}", file=sys.stderr)
                continue
            for name, t in rec.source.tensors.items():
                if args.field and name != args.field:
                    continue
                bounds = Bounds.from_slices(_parse_slice(args.slice, t.ndim), t.shape) if args.slice else None
                print(json.dumps({"path": str(rec.path), "field": name, **tensor_stats(t, bounds, engine)}))
                printed += 1
    except TensorServerError as exc:
        print(f"stats: {exc}", file=sys.stderr)
        return 2
    finally:
        catalog.close()
    if not printed:
        why = f"named {args.field!r}" if args.field else "(no file or dataset there is a known format)"
        print(f"stats: no tensor under {args.path} {why}", file=sys.stderr)
        return 2
    return 1 if unreadable else 0


#: command name -> its function (``cli.main``)
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"url": cmd_url, "list": cmd_list, "stats": cmd_stats}
