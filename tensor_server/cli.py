"""Command line: ``python -m tensor_server {serve,list,run,version}``."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from typing import Sequence

__all__ = ["main"]

log = logging.getLogger("tensor_server")


class _KeyValueFormatter(logging.Formatter):
    """One line per record, ``key=value`` pairs: greppable, parseable, quiet."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage().replace('"', "'")
        out = f'ts={self.formatTime(record, "%Y-%m-%dT%H:%M:%S")} level={record.levelname.lower()} logger={record.name} msg="{msg}"'
        if record.exc_info:
            out += " exc=" + repr(self.formatException(record.exc_info))
        return out


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.WARNING))


class _ScanProgress:
    """A one-line progress display in a terminal; periodic log lines otherwise."""

    def __init__(self, stream=sys.stderr) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last = 0.0
        self.folders = 0

    def __call__(self, folder: str, sources: int) -> None:
        self.folders += 1
        now = time.monotonic()
        if now - self.last < (0.1 if self.tty else 5.0):
            return
        self.last = now
        if self.tty:
            short = folder if len(folder) < 60 else "…" + folder[-59:]
            self.stream.write(f"\r\x1b[Kscanning: {self.folders} folders, {sources} sources  {short}")
            self.stream.flush()
        else:  # plain lines, not log records: progress is not a warning, yet must show
            self.stream.write(f"scanning: {self.folders} folders, {sources} sources, at {folder}\n")
            self.stream.flush()

    def done(self, summary: dict) -> None:
        line = (f"scan done: {summary['total']} sources ({summary['unresolved']} unreadable), "
                f"{self.folders} folders")
        if self.tty:
            self.stream.write("\r\x1b[K" + line + "\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _count(text: str) -> int:
    """argparse type for an integer >= 0 (a clear usage error otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tensor_server", description="Serve bio-imaging files as N-D tensors over Arrow Flight (biopb protocol).")
    sub = p.add_subparsers(dest="command", required=True)

    def server_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--host", help="bind address (default 127.0.0.1; non-loopback needs --token)")
        sp.add_argument("--port", type=int, help="port (default 8815; 0 picks a free one)")
        sp.add_argument("--config", help="TOML config file (flags override it)")
        sp.add_argument("--token", help="require 'authorization: Bearer TOKEN' on every call but health")
        sp.add_argument("--cache-dir", help="chunk cache folder")
        sp.add_argument("--cache-max-bytes", type=int, help="chunk cache file-tier budget in bytes (default 4 GiB)")
        sp.add_argument("--write-dir", help="folder for uploads (scratch source)")
        sp.add_argument("--rescan-seconds", type=float, help="rescan the roots this often (0 = never)")
        sp.add_argument("--read-workers", type=_count,
                        help="units a scaled read decodes ahead on a shared pool (default 0 = the cores)")
        sp.add_argument("--log-level", help="debug, info, warning (default), error")

    serve = sub.add_parser("serve", help="serve the sources found under ROOTs")
    serve.add_argument("roots", nargs="*", metavar="ROOT")
    server_flags(serve)

    run = sub.add_parser("run", help="serve ROOTs, or a generated demo dataset when none is given, and print how to read")
    run.add_argument("roots", nargs="*", metavar="ROOT")
    server_flags(run)

    lst = sub.add_parser("list", help="print the sources and tensors found under ROOTs")
    lst.add_argument("roots", nargs="+", metavar="ROOT")

    sub.add_parser("version", help="print the version")
    return p


def _settings(args: argparse.Namespace):
    from tensor_server.config import load_settings

    return load_settings(
        args.config, roots=list(args.roots), host=args.host, port=args.port, token=args.token,
        cache_dir=args.cache_dir, cache_max_bytes=args.cache_max_bytes, write_dir=args.write_dir,
        rescan_seconds=args.rescan_seconds, read_workers=args.read_workers, log_level=args.log_level,
    )


def _snippet(location: str, token: str | None, array_id: str, scale: list[int], method: str) -> str:
    tok = f", token={token!r}" if token else ""
    return (
        "from biopb.tensor import TensorFlightClient\n"
        f"client = TensorFlightClient({location!r}{tok})\n"
        "print(client.query(\"SELECT source_id, source_type FROM sources\"))\n"
        f"level = client.get_array({array_id!r}, scale_hint={scale}, reduction_method={method!r})\n"
        "print(level.shape, level.dtype)"
    )


def cmd_serve(args: argparse.Namespace, demo: bool = False) -> int:
    from tensor_server.catalog import Catalog
    from tensor_server.core.downsample import warm_up
    from tensor_server.core.pyramid import PyramidPolicy, advertised_levels
    from tensor_server.flight import ServerConfig, TensorFlightServer

    settings = _settings(args)
    setup_logging(settings.log_level)
    if demo and not settings.roots:
        from tensor_server.config import default_cache_dir
        from tensor_server.demo import make_demo_dataset

        folder = default_cache_dir() / "demo"
        print(f"no ROOT given: generating the demo dataset in {folder} ...", file=sys.stderr)
        settings.roots = [str(make_demo_dataset(folder))]
    if not settings.roots:
        print("serve: give at least one ROOT (or roots = [...] in --config)", file=sys.stderr)
        return 2
    catalog = Catalog(settings.roots)
    config = ServerConfig(
        host=settings.host, port=settings.port, token=settings.token,
        pyramid=PyramidPolicy(settings.plane_budget_px, settings.volume_budget_voxels),
        rescan_seconds=settings.rescan_seconds, cache_dir=settings.cache_dir,
        cache_max_bytes=settings.cache_max_bytes, source_scaled_reads=settings.source_scaled_reads,
        write_dir=settings.write_dir, read_workers=settings.read_workers or None,
    )
    from tensor_server.cache import CacheLocked, CacheManager
    from tensor_server.config import default_cache_dir

    cache_dir = settings.cache_dir or str(default_cache_dir() / "chunks")
    try:
        cache = CacheManager(cache_dir, max_total_bytes=settings.cache_max_bytes,
                             source_scaled_reads=settings.source_scaled_reads)
    except CacheLocked as exc:
        print(f"serve: {exc}; pass another --cache-dir", file=sys.stderr)
        return 2
    try:
        server = TensorFlightServer(catalog, config, cache_manager=cache)
    except ValueError as exc:
        cache.close()
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # pyarrow raises a bare ArrowException when the bind fails
        cache.close()
        print(f"serve: cannot listen on {settings.host}:{settings.port} ({exc}); is the port in use? "
              "Pass --port (0 picks a free one).", file=sys.stderr)
        return 2
    location = server.location
    print(f"tensor-server listening on {location} (health answers STARTING until the scan ends)", file=sys.stderr)

    def background_start() -> None:
        progress = _ScanProgress()
        summary = catalog.scan(progress)
        progress.done(summary)
        elapsed = warm_up()
        log.info("numba kernels warmed in %.2f s", elapsed)
        catalog.start_periodic_rescan(settings.rescan_seconds)
        if demo:
            pick = None
            for rec in catalog.records():
                if rec.source is not None:
                    t = rec.source.tensor()
                    levels = advertised_levels(t, config.pyramid)
                    pick = (t, levels[1] if len(levels) > 1 else levels[0])
                    if len(levels) > 1:
                        break
            if pick is not None:
                t, lv = pick
                print("\nRead a scaled level with the biopb SDK (pip install 'biopb[tensor]'):\n", file=sys.stderr)
                print(_snippet(location, settings.token, t.array_id, list(lv.scale), lv.method), file=sys.stderr)
                print("\nor list what is served: python -m tensor_server list " + " ".join(settings.roots), file=sys.stderr)
                print("Ctrl-C stops the server.", file=sys.stderr)

    threading.Thread(target=background_start, name="tensor-server-startup", daemon=True).start()
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        catalog.close()
        cache.close()  # seals the open segment
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from tensor_server.catalog import Catalog

    setup_logging("error")
    catalog = Catalog(args.roots)
    catalog.scan()
    for rec in catalog.records():
        if rec.source is None:
            print(f"{rec.source_id}  [{rec.type}]  UNREADABLE: {rec.unresolved_reason}")
            continue
        print(f"{rec.source_id}  [{rec.type}]  {rec.path}")
        for name, t in rec.source.tensors.items():
            levels = f", {len(t.native_levels)} stored levels" if t.native_levels else ""
            labels = " labels" if t.is_labels else ""
            print(f"    {t.array_id}  {'x'.join(map(str, t.shape))} {''.join(t.dim_labels) if all(len(d) == 1 for d in t.dim_labels) else t.dim_labels} {t.dtype.str}{labels}{levels}")
    catalog.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "version":
        from tensor_server import __version__

        print(__version__)
        return 0
    if args.command == "list":
        return cmd_list(args)
    return cmd_serve(args, demo=args.command == "run")
