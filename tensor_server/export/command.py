"""The CLI's ``export`` command: flags, the progress display, Ctrl-C.

Kept out of ``cli.py`` (which only registers the parser and calls ``run``) and light at import:
argparse only; the exporter, zarr and the readers load when the command runs.

Progress: a tqdm bar on a terminal, else one JSON line per record on stdout (the records
``export_tensor`` emits, the ones a service action streams). Ctrl-C (SIGINT) asks the export to
stop, within one chunk's encoding: the units already written whole are recorded, and
``--resume`` continues from there.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

__all__ = ["add_arguments", "run"]

#: exit codes: bad input or a failed export; stopped by Ctrl-C (the shell's 128 + SIGINT)
EXIT_FAILED, EXIT_CANCELLED = 2, 130


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE", help="a file or folder the server can open (with --server: an array id)")
    p.add_argument(
        "dest", metavar="DEST", help="the OME-Zarr folder to write (written as DEST.partial, renamed when done)"
    )
    p.add_argument("--array-id", help="which tensor of SOURCE (its field or array id; default: the first)")
    p.add_argument(
        "--server", metavar="URL", help="read SOURCE, an array id, from this running server (grpc://host:port)"
    )
    p.add_argument(
        "--token",
        help="the server's bearer token (default: the upstream reader's "
        "$TENSOR_SERVER_UPSTREAM_TOKEN; a token on the command line shows in ps)",
    )
    p.add_argument(
        "--no-labels", action="store_true", help="leave the source's label images out (default: under labels/)"
    )
    p.add_argument("--levels", default="auto", help="'auto' (the served pyramid) or N levels halving Y and X")
    p.add_argument("--method", help="reduction: area (default), nearest, min, max, mode (labels' default), median")
    p.add_argument("--chunks", help="chunk shape per output axis, e.g. 1,256,256 (Y and X at least 64)")
    p.add_argument(
        "--shards",
        help="shard shape per output axis (a whole number of chunks; one shard at every "
        "level at most 64 MiB), e.g. 1,2048,2048",
    )
    p.add_argument("--codec", default="blosc-zstd", choices=("zstd", "blosc-zstd", "none"))
    p.add_argument(
        "--ngff", default="0.5", choices=("0.5", "0.4"), help="0.5 (zarr v3, sharded; default) or 0.4 (zarr v2)"
    )
    p.add_argument("--workers", type=int, default=2, help="writer threads (default 2)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--overwrite",
        action="store_true",
        help="replace DEST, an image this command exported (only once the new image is complete)",
    )
    mode.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted export of the same source and options (nothing to do if DEST "
        "is that export, finished)",
    )
    p.add_argument(
        "--progress",
        choices=("auto", "bar", "json", "none"),
        default="auto",
        help="a bar on a terminal, JSON lines otherwise (auto)",
    )


def _options(args: argparse.Namespace):
    from tensor_server.export.options import ExportOptions, parse_shape

    return ExportOptions(
        levels="auto" if args.levels == "auto" else ExportOptions.from_mapping({"levels": args.levels}).levels,
        method=args.method,
        chunks=parse_shape(args.chunks, "--chunks") if args.chunks else None,
        shards=parse_shape(args.shards, "--shards") if args.shards else None,
        codec=args.codec,
        ngff=args.ngff,
        workers=args.workers,
        mode="overwrite" if args.overwrite else "resume" if args.resume else "create",
    )


class _Display:
    """tqdm on a terminal, JSON lines otherwise (or nothing)."""

    def __init__(self, kind: str) -> None:
        self.kind = ("bar" if sys.stderr.isatty() else "json") if kind == "auto" else kind
        self.bar = None

    def __call__(self, record: dict) -> None:
        if self.kind == "json":
            print(json.dumps(record), flush=True)
        elif self.kind == "bar":
            self._bar(record)

    def _bar(self, record: dict) -> None:
        from tqdm import tqdm

        if record["event"] == "start":
            self.bar = tqdm(
                total=record["units_total"],
                initial=record["units_resumed"],
                unit="unit",
                desc=f"export {record['dest']}",
                file=sys.stderr,
            )
        elif record["event"] == "unit" and self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(written=f"{record['bytes_written'] / 1e6:.0f} MB", refresh=False)
        elif record["event"] == "done":
            if self.bar is not None:
                self.bar.close()
            print(json.dumps(record), flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _steady_allocator() -> None:
    """glibc's malloc, told to give a streamed pass's memory back: blocks of 8 MiB and more
    (units, level blocks) always mmap'd, so they return to the system when freed (the default
    threshold grows with every freed block until units land on the heap, which keeps them),
    and two arenas (not eight per core, each holding freed units of its threads). A 30x4096²
    export held 694 MB resident without it, 392 MB with it. Why 8 MiB and not lower: every
    inner chunk, its copy and its encode buffer (2 MiB for the default volume chunks) stays
    below it and reuses heap memory; at a 1 MiB threshold each was an mmap and its page
    faults, 5.3-5.9 M minor faults per export: 30x4096² from zarr 18.6 s / 340 MB against
    14.2 s / 358 MB at 8 MiB, 32768² from TIFF 35.6 s / 140 MB against 31.4 s / 161 MB
    (2026-12-03, idle). The heap's top is trimmed only past 16 MiB free: setting the mmap
    threshold pins the trim threshold at 128 KiB, so every freed slab temporary and encode
    buffer was handed back and faulted in again — 3.0 M minor faults and 9.4 s system time in a
    30x4096² export, 47 k and 3.9 s at 16 MiB (282 k at 8 MiB), for 6 MB more peak RSS. No-op
    off glibc."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_arena_max, m_mmap_threshold, m_trim_threshold = -8, -3, -1
    libc.mallopt(m_mmap_threshold, 8 << 20)
    libc.mallopt(m_trim_threshold, 16 << 20)
    libc.mallopt(m_arena_max, 2)


def run(args: argparse.Namespace) -> int:
    from tensor_server.errors import ReadCancelled, TensorServerError
    from tensor_server.export.run import export_tensor
    from tensor_server.export.sources import open_export_source

    _steady_allocator()
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    display = _Display(args.progress)
    try:
        options = _options(args)
        with open_export_source(args.source, args.array_id, server=args.server, token=args.token) as source:
            for skipped in source.skipped:
                print(f"export: label image {skipped['name']!r} left out: {skipped['reason']}", file=sys.stderr)
            export_tensor(
                source.tensor,
                args.dest,
                options,
                labels=None if args.no_labels else source.labels,
                progress=display,
                cancelled=stop.is_set,
            )
        return 0
    except ReadCancelled as exc:
        display.close()
        print(f"export: {exc}", file=sys.stderr)
        return EXIT_CANCELLED
    except TensorServerError as exc:
        display.close()
        print(f"export: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:  # the destination cannot be written (permissions, a read-only disk)
        display.close()
        print(f"export: {exc.filename or args.dest}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        signal.signal(signal.SIGINT, previous)
