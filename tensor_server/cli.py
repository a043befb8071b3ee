"""Command line: ``python -m tensor_server {serve,list,run,url,stats,export,version}``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tensor_server.cli_inspect import roots_present
from tensor_server.cli_logging import REQUEST_LOG_OFF, REQUEST_LOG_STDERR, ScanProgress, setup_logging
from tensor_server.cli_parser import DEMO_HTTP_PORT, DEMO_METRICS_PORT, build_parser
from tensor_server.cli_workers import (
    WorkerRole,
    as_worker,
    cache_peers,
    follow_catalog,
    follow_grants,
    forward_to_primary,
    merge_worker_metrics,
    open_forward_door,
    primary_workers,
    publish_catalog,
    refuse_workers,
    render_specs_folder,
    serve_as_worker,
    worker_role,
)
from tensor_server.errors import InvalidArgument
from tensor_server.service.memory import MemoryReturn, limit_malloc_arenas

if TYPE_CHECKING:
    from tensor_server.cli_banner import Example, ServingFacts

__all__ = ["main"]

log = logging.getLogger("tensor_server")


def _settings(args: argparse.Namespace):
    from tensor_server.config import load_settings

    return load_settings(
        args.config,
        roots=list(args.roots),
        host=args.host,
        port=args.port,
        token=args.token,
        cache_dir=args.cache_dir,
        cache_max_bytes=args.cache_max_bytes,
        write_dir=args.write_dir,
        writable=args.writable,
        rois_path=args.rois_db,
        read_workers=args.read_workers,
        rescan_seconds=args.rescan_seconds,
        montage_gap=args.montage_gap,
        log_level=args.log_level,
        http_port=args.http_port,
        tls=args.tls,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        sans=args.san,
        insecure=args.insecure,
        http_token=args.http_token,
        cors_origins=args.cors_origin,
        read_only=args.read_only,
        add_source=args.add_source,
        metrics_port=args.metrics_port,
        log_format=args.log_format,
        request_log=args.request_log,
    )


def _install_remote(settings) -> None:
    """The ``[remote]`` section for every image read by URL in this process; the hosts of the
    operator's own http(s) roots count as allowed (the operator named them)."""
    from urllib.parse import urlsplit

    from tensor_server.adapters.url_source import RemoteSettings, set_remote_settings
    from tensor_server.config import default_cache_dir

    root_hosts = tuple(
        urlsplit(r).netloc.rpartition("@")[2] for r in settings.roots if str(r).startswith(("http://", "https://"))
    )
    set_remote_settings(
        RemoteSettings(
            allowed_hosts=tuple(settings.remote_allowed_hosts),
            timeout=float(settings.remote_timeout),
            revalidate_seconds=float(settings.remote_revalidate_seconds),
            per_host=int(settings.remote_per_host),
            cache_dir=settings.remote_cache_dir or str(default_cache_dir() / "remote"),
            cache_max_bytes=int(settings.remote_cache_max_bytes),
            max_object_bytes=int(settings.remote_max_object_bytes),
            operator_hosts=root_hosts,
        )
    )


def _server_tls(settings, say: bool = True):
    """The certificate both doors serve (None: plaintext), after the transport rule
    (service/tls.py); an exit code with the reason printed when it cannot be had. ``say``:
    print its fingerprint (a worker does not: its primary has)."""
    from tensor_server.config import default_cache_dir
    from tensor_server.errors import TensorServerError
    from tensor_server.service.tls import require_safe_transport, server_tls

    wants = bool(settings.tls or settings.tls_cert or settings.tls_key)
    try:
        require_safe_transport(settings.host, settings, wants)
        tls = (
            server_tls(default_cache_dir(), cert=settings.tls_cert, key=settings.tls_key, sans=settings.sans)
            if wants
            else None
        )
    except TensorServerError as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    for line in tls.startup_lines() if tls is not None and say else ():
        print(line, file=sys.stderr)
    return tls


class _Taken(Exception):
    """No file or folder this server may use (the message says which flag to pass)."""


def _take(explicit: str | None, default: Path, port: int, flag: str, opener, busy: type[Exception]):
    """``opener(path)`` on the path given with ``flag``; without one, on ``default`` or, when
    another server holds that, on ``<default>-<port>``: a second server on this machine
    gets files of its own instead of failing on a lock. Raises _Taken naming ``flag``."""
    if explicit:
        candidates = [Path(explicit)]
    else:
        candidates = [default, default.with_name(f"{default.stem}-{port or os.getpid()}{default.suffix}")]
    for i, path in enumerate(candidates):
        try:
            result = opener(str(path))
        except busy as exc:
            if i + 1 < len(candidates):
                print(f"serve: {path} is held by another tensor-server; using {candidates[i + 1]}", file=sys.stderr)
                continue
            raise _Taken(f"{exc}; pass another {flag}" if flag else str(exc)) from None
        return result
    raise AssertionError("unreachable")


def _catalog_store(port: int):  # CatalogStore | None
    """The catalog store in the server home, or a file of its own beside it when another
    server holds that one (``_take``); None (said on stderr) when neither can be had: the
    catalog is then kept in memory, and the next start opens every source again."""
    from tensor_server.catalog.store import CatalogStore, CatalogStoreBusy
    from tensor_server.config import default_cache_dir

    def open_store(path: str) -> CatalogStore:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return CatalogStore(path)

    try:
        return _take(None, default_cache_dir() / "catalog.duckdb", port, "", open_store, CatalogStoreBusy)
    except Exception as exc:  # the store is a cache: serve without it
        print(f"serve: the catalog is kept in memory only ({exc})", file=sys.stderr)
        return None


def _open_uploads(catalog, settings, explicit: bool):
    """The upload manager over ``settings.write_dir`` (None without one), which holds that
    folder for this server's life. A folder given with ``--write-dir`` that another server
    holds is refused; the demo's default gives way to ``<default>-<port>`` (``_take``)."""
    from tensor_server.uploads import UploadManager, WriteDirHeld

    if not settings.write_dir:
        return None

    def open_manager(path: str) -> UploadManager:
        try:
            manager = UploadManager(catalog, path, upload_ttl=settings.upload_ttl, scratch_ttl=settings.scratch_ttl)
        except OSError as exc:
            raise _Taken(f"the write dir {path} is unusable ({exc}); pass another --write-dir") from None
        settings.write_dir = path
        manager.start_sweeps()
        return manager

    return _take(
        settings.write_dir if explicit else None,
        Path(settings.write_dir),
        settings.port,
        "--write-dir",
        open_manager,
        WriteDirHeld,
    )


def _close_catalog(catalog, store) -> None:  # Catalog, CatalogStore | None
    """Close the catalog, then the store it wrote to (``_catalog_store`` opened it)."""
    catalog.close()
    if store is not None:
        store.close()


def _port_clash(host: str, port: int | None, flag: str, make_var: str) -> str | None:
    """Why ``port`` cannot be listened on (another process holds it), in plain words, or
    None. Checked before anything starts, so the message is the first and only line."""
    import errno
    import socket

    if not port:
        return None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return None  # an unresolvable host: the bind itself reports it
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(addr)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return None
            return (
                f"cannot listen on {host}:{port}: port in use (another tensor-server, or another "
                f"program). Pass {flag} N (0 picks a free one), or with make: make run {make_var}=N"
            )
    return None


def cmd_serve(args: argparse.Namespace, demo: bool = False) -> int:
    from tensor_server.catalog import Catalog
    from tensor_server.core.downsample import warm_up
    from tensor_server.service import ServingRuntime

    limit_malloc_arenas()  # before the serving threads: what their arenas keep is not trimmed

    try:
        settings = _settings(args)
    except InvalidArgument as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    from tensor_server.config import keep_home_files_private

    for warning in keep_home_files_private():  # before the first file is written (the request log, the demo)
        print(warning, file=sys.stderr)
    role = worker_role()  # set when a primary started this process (cli_workers.py)
    count = role.count if role is not None else getattr(args, "workers", 1)
    if role is not None:
        as_worker(settings, role)
    elif count > 1 and refuse_workers(settings, count):
        return 2
    request_log = _setup_logging(settings, demo)
    if demo and not settings.roots:
        from tensor_server.config import default_cache_dir
        from tensor_server.demo import make_demo_dataset

        folder = Path(args.demo_dir) if args.demo_dir else default_cache_dir() / "demo"
        print(
            f"no ROOT given: serving the demo dataset in {folder} (generated on first use; delete the "
            "folder to remove it)",
            file=sys.stderr,
        )
        settings.roots = [str(make_demo_dataset(folder))]
    own_write_dir = bool(settings.write_dir)  # the demo's default is taken like the other defaults (_take)
    if demo and not settings.write_dir:  # make run shows uploads too
        from tensor_server.config import default_cache_dir

        settings.write_dir = str(default_cache_dir() / "demo-uploads")
        settings.writable = True
    if not settings.roots:
        print("serve: give at least one ROOT (or roots = [...] in --config)", file=sys.stderr)
        return 2
    if settings.writable and not settings.write_dir:
        print("serve: --writable needs --write-dir DIR (where uploaded tensors are stored)", file=sys.stderr)
        return 2
    if demo and settings.http_port is None:
        settings.http_port = DEMO_HTTP_PORT
    if demo and settings.metrics_port is None:
        settings.metrics_port = DEMO_METRICS_PORT
    clash = (
        _port_clash(settings.host, settings.port, "--port", "PORT")
        or _port_clash(settings.host, settings.http_port, "--http-port", "HTTP_PORT")
        or _port_clash(settings.metrics_host, settings.metrics_port, "--metrics-port", "METRICS_PORT")
    )
    if clash is not None and role is None:  # said first: before any file is opened or gRPC speaks
        print(f"serve: {clash}", file=sys.stderr)
        return 2
    if not roots_present(settings.roots):
        return 2
    _install_remote(settings)
    from tensor_server.cache import CacheLocked, CacheManager
    from tensor_server.catalog.rois import RoiStoreBusy
    from tensor_server.config import default_cache_dir, default_data_dir

    tls = _server_tls(settings, say=role is None)
    if isinstance(tls, int):
        return tls

    store = _catalog_store(settings.port) if role is None else None  # a worker keeps its catalog in memory

    def open_catalog(rois_path: str | None) -> Catalog:
        if rois_path is not None:
            Path(rois_path).parent.mkdir(parents=True, exist_ok=True)
        cat = Catalog(
            settings.roots,
            rois_path=rois_path,
            follow_symlinks_outside_roots=settings.follow_symlinks_outside_roots,
            open_timeout_seconds=settings.open_timeout_seconds,
            montage_gap=settings.montage_gap,
            store=store,
        )
        try:
            cat.rois.open()
        except Exception:
            cat.close()
            raise
        return cat

    try:
        catalog = (
            open_catalog(None)
            if role is not None
            else _take(
                settings.rois_path,
                default_data_dir() / "annotations.duckdb",
                settings.port,
                "--rois-db",
                open_catalog,
                RoiStoreBusy,
            )
        )
    except (_Taken, InvalidArgument) as exc:
        if store is not None:
            store.close()
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    try:
        cache = _take(
            str(role.cache_folder()) if role is not None and role.cache_dir else settings.cache_dir,
            default_cache_dir() / "chunks",
            settings.port,
            "--cache-dir",
            lambda d: CacheManager(
                d, max_total_bytes=settings.cache_max_bytes // count, peers=cache_peers(d, role, count)
            ),
            CacheLocked,
        )
    except _Taken as exc:
        _close_catalog(catalog, store)
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the cache folder cannot be made or locked: serve uncached, never refuse
        print(f"serve: chunk cache disabled, the cache folder is unusable ({exc})", file=sys.stderr)
        cache = None
    try:
        uploads = _open_uploads(catalog, settings, own_write_dir)
    except _Taken as exc:
        _close_catalog(catalog, store)
        if cache is not None:
            cache.close()
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    from tensor_server.cli_banner import ServingFacts
    from tensor_server.http.access_url import page_url, viewer_url, write_url_file

    http_token = (
        _http_token(args.rotate_http_token and role is None)
        if settings.http_port is not None and settings.http_token
        else None
    )
    follower = publisher = None
    if role is not None:  # a worker listens once it knows the roots: until then the others serve
        follower = follow_catalog(role, catalog)  # the primary's uploads and added paths, from the start
        catalog.scan()
    if settings.shares_dir is None:  # share links outlive a restart, and the workers read the same list
        settings.shares_dir = str(default_data_dir() / "shares")
    runtime = ServingRuntime(
        catalog, settings, cache=cache, uploads=uploads, tls=tls, access_tokens=[http_token] if http_token else []
    )
    if follower is not None:
        follow_grants(runtime, follower)
    if count > 1:  # a render spec posted to one process is read by every other
        from tensor_server.render.spec_store import SharedSpecStore

        runtime.viewer.specs = SharedSpecStore(render_specs_folder(role, cache))
    metrics, opened = _open_metrics(runtime, say=role is None)
    doors = _open_doors(runtime, settings, http_token, role, count) if opened else None
    if doors is None:
        if follower is not None:
            follower.close()
        if metrics is not None:
            metrics.stop()
        runtime.close()
        if uploads is not None:
            uploads.close()
        _close_catalog(catalog, store)
        if cache is not None:
            cache.close()
        return 2
    server, http = doors
    location = server.location if server is not None else http.url
    url_path = None
    workers = forward = None
    memory = MemoryReturn()  # a burst of large requests must not keep the server at its peak size
    in_main = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm) if in_main else None
    try:  # from here on a Ctrl-C (or SIGTERM) stops the server the one way, whenever it comes
        if role is None and count > 1:
            publisher = publish_catalog(runtime, cache, server.port)  # read by every worker (at its start too)
            forward = open_forward_door(runtime, http)  # the workers hand annotation requests to it
            workers = primary_workers(args.argv, count, runtime, location, server.port, http.port, cache, forward.port)
            failed = workers.start()
            if failed is not None:
                print(f"serve: {failed}", file=sys.stderr)
                return 2
            if metrics is not None:  # the primary's /metrics answers for every process
                merge_worker_metrics(runtime, workers)
        if role is not None:
            return serve_as_worker(role, http, catalog, settings, metrics)
        url_path = write_url_file(default_cache_dir(), http.port, http.url, http_token) if http is not None else None
        print(
            f"tensor-server listening on {location} (serving now: sources appear as discovery finds them; health's first_scan_done says when it has finished)",
            file=sys.stderr,
        )
        if catalog.restored:
            print(
                f"{catalog.restored} sources listed from the last run's catalog; the scan checks them for changes",
                file=sys.stderr,
            )
        if http is not None:
            print(
                f"OME-Zarr over HTTP at {viewer_url(http.url, http_token, 'zarr', '<array_id>')} (NGFF 0.4) and "
                f"{viewer_url(http.url, http_token, 'zarr3', '<array_id>')} (NGFF 0.5)",
                file=sys.stderr,
            )

        def facts(example: Example | None) -> ServingFacts:
            return ServingFacts(
                location=location,
                catalog_url=page_url(http.url, http_token) if http is not None else None,
                metrics_url=metrics.url if metrics is not None else None,
                request_log=request_log,
                token=settings.token,
                tls_fingerprint=tls.fingerprint if tls is not None else None,
                list_command=f"{sys.executable} -m tensor_server list " + " ".join(settings.roots),
                example=example,
                upload=demo and runtime.writable,
            )

        def background_start() -> None:
            progress = ScanProgress()
            summary = catalog.scan(progress)
            progress.done(summary)
            if demo:  # run's snippet reads a tensor the scan found
                _print_start_up(facts(_example(catalog, runtime.policy, http, http_token)))
            elapsed = warm_up()
            log.info("numba kernels warmed in %.2f s", elapsed)
            catalog.start_periodic_rescan(settings.rescan_seconds)

        if not demo:  # everything serve's block names is known now
            _print_start_up(facts(None))
        threading.Thread(target=background_start, name="tensor-server-startup", daemon=True).start()
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        memory.close()
        if workers is not None:
            workers.stop()
        for shared in (publisher, follower):
            if shared is not None:
                shared.close()
        if forward is not None:
            forward.stop()
        if http is not None:
            http.stop()
        if url_path is not None:
            url_path.unlink(missing_ok=True)
        if metrics is not None:
            metrics.stop()
        runtime.close()
        if uploads is not None:
            uploads.close()  # releases the write dir
        _close_catalog(catalog, store)
        if cache is not None:
            cache.close()  # seals the open segment
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    return 0


def _example(catalog, policy, http, http_token) -> Example | None:
    """The tensor ``run``'s snippet reads: the first with a computed level (at that level),
    else the first found (at full resolution); None when the scan found no tensor."""
    from tensor_server.cli_banner import Example
    from tensor_server.core.pyramid import advertised_levels
    from tensor_server.http.access_url import viewer_url

    pick = None
    for rec in catalog.records():
        if rec.source is not None and rec.source.tensors:  # scratch holds none
            t = rec.source.tensor()
            levels = advertised_levels(t, policy)
            pick = (t, levels[1] if len(levels) > 1 else levels[0])
            if len(levels) > 1:
                break
    if pick is None:
        return None
    t, lv = pick
    return Example(
        t.array_id,
        tuple(lv.scale),
        lv.method,
        viewer_url(http.url, http_token, "zarr", t.array_id) if http is not None else None,
    )


def _print_start_up(facts: ServingFacts) -> None:
    """The snippets and the block of links (``cli_banner``), on stdout: they are what the
    command answers; progress, warnings and logs go to stderr."""
    from tensor_server.cli_banner import startup_text

    print("\n" + startup_text(facts), flush=True)


def _setup_logging(settings, demo: bool) -> str | None:
    """Logging as ``settings`` say, the request log where ``--request-log`` says or, by
    default, on stderr for ``serve`` and in the server home for ``run`` (its terminal keeps
    the start-up block). Returns the request log's file, if it goes to one."""
    from tensor_server.config import default_cache_dir

    dest = settings.request_log or (str(default_cache_dir() / "logs" / "requests.log") if demo else REQUEST_LOG_STDERR)
    try:
        setup_logging(settings.log_level, settings.log_format, requests=dest)
    except OSError as exc:
        print(
            f"serve: the request log cannot be written to {dest} ({exc}): requests are logged on stderr",
            file=sys.stderr,
        )
        setup_logging(settings.log_level, settings.log_format, requests=REQUEST_LOG_STDERR)
        return None
    return dest if dest not in (REQUEST_LOG_STDERR, REQUEST_LOG_OFF) else None


def _http_token(rotate: bool) -> str:
    """The HTTP door's access token: the one kept in the server home, so URLs outlive a
    restart (``stored_access_token``); a new one is said on stderr, and a home where none can
    be kept gives this run one of its own."""
    from tensor_server.config import default_cache_dir
    from tensor_server.http.access_url import mint_access_token, stored_access_token, token_file

    path = token_file(default_cache_dir())
    try:
        token, why = stored_access_token(default_cache_dir(), rotate=rotate)
    except OSError as exc:
        print(
            f"serve: the HTTP access token cannot be kept in {path} ({exc}): its URLs last until this server stops",
            file=sys.stderr,
        )
        return mint_access_token()
    if why:
        print(
            f"a new HTTP access token ({why}), kept in {path}: URLs that carry it outlive restarts "
            "(--rotate-http-token or deleting the file makes another)",
            file=sys.stderr,
        )
    return token


def _open_doors(runtime, settings, http_token, role: WorkerRole | None = None, count: int = 1):
    """The Flight door, and the HTTP door when ``http_port`` is set (its access token
    ``http_token``); None (after saying why on stderr) when one cannot listen. A worker
    (``role``) opens no Flight door: it names its primary's (cli_workers.py)."""
    from tensor_server.errors import TensorServerError
    from tensor_server.flight import TensorFlightServer

    if role is not None:
        server = None
        runtime.flight_listening(settings.host, role.flight_port)
    try:
        server = server if role is not None else TensorFlightServer(runtime, settings.host, settings.port)
    except TensorServerError as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return None
    except Exception as exc:  # pyarrow raises a bare ArrowException when the bind fails
        print(
            f"serve: cannot listen on {settings.host}:{settings.port} ({exc}); is the port in use? "
            "Pass --port (0 picks a free one).",
            file=sys.stderr,
        )
        return None
    if settings.http_port is None:
        return server, None
    from tensor_server.http.access_url import door_security
    from tensor_server.http.app import HttpFrontEnd, build_app

    security = door_security(
        runtime,
        access_token=http_token,
        bind_host=settings.host,
        sans=settings.sans,
        allowed_hosts=settings.http_allowed_hosts,
        cors_origins=settings.cors_origins,
    )
    app = build_app(runtime, security)
    if role is not None:  # what only the primary answers (annotations), answered by it
        app = forward_to_primary(app, role, runtime.tls)
    try:
        http = HttpFrontEnd(
            app,
            settings.host,
            settings.http_port,
            tls=runtime.tls,
            reuse_port=count > 1 or role is not None,
        )
        http.start()
        runtime.http_listening(http.scheme, settings.host, http.port)
    except Exception as exc:  # uvicorn reports a taken port in several ways
        if server is not None:
            server.shutdown()
        print(
            f"serve: cannot serve HTTP on {settings.host}:{settings.http_port} ({exc}); pass another --http-port",
            file=sys.stderr,
        )
        return None
    return server, http


def _open_metrics(runtime, say: bool = True):  # (MetricsDoor | None, ok)
    """(the metrics door when ``metrics_port`` is set, whether the server may go on): a
    door refused (off loopback without a token) or that cannot bind stops the start, like
    the other doors, after saying why on stderr."""
    s = runtime.settings
    if s.metrics_port is None:
        return None, True
    from tensor_server.errors import TensorServerError
    from tensor_server.http.metrics_door import MetricsDoor

    try:
        door = MetricsDoor(runtime)
    except TensorServerError as exc:
        print(f"serve: metrics: {exc} ([metrics] host)", file=sys.stderr)
        return None, False
    except Exception as exc:  # uvicorn reports a taken port in several ways
        print(
            f"serve: cannot serve metrics on {s.metrics_host}:{s.metrics_port} ({exc}); pass another --metrics-port",
            file=sys.stderr,
        )
        return None, False
    if say:  # not a worker's: its primary's door answers for it
        print(f"Prometheus metrics at {door.url}", file=sys.stderr)
    return door, True


def _stop_on_sigterm(signum: int, frame) -> None:
    """SIGTERM (systemd, docker stop, kill) stops the server the way Ctrl-C does, so the open
    cache segment is sealed instead of being left for the next boot to re-walk."""
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # serve --workers starts its workers with the same arguments
    if args.command == "version":
        from tensor_server import __version__

        print(__version__)
        return 0
    if args.command in ("list", "url", "stats"):
        from tensor_server.cli_inspect import COMMANDS

        return COMMANDS[args.command](args)
    if args.command == "export":
        from tensor_server.export.command import run as cmd_export

        return cmd_export(args)
    if args.command == "share":
        from tensor_server.cli_share import run as cmd_share

        return cmd_share(args)
    if args.command == "nginx-config":
        from tensor_server.deploy.nginx import run as cmd_nginx_config

        return cmd_nginx_config(args)
    code = cmd_serve(args, demo=args.command == "run")
    _exit_without_final_collection()
    return code


def _exit_without_final_collection() -> None:
    """A stopped server exits without the interpreter's last full garbage collection: it is
    1.1 s of a 1.5 s stop (measured: numba's, llvmlite's and scipy's heaps), and every file the
    server holds is closed before this. ``gc.freeze`` at exit hides the heap from that
    collection; memory goes back to the system with the process."""
    import atexit
    import gc

    atexit.register(gc.freeze)
