"""``serve --workers N``: the primary process and the N-1 worker processes it keeps running.

One Python process serves HTTP at the rate one interpreter lock allows; N processes share the
HTTP port through ``SO_REUSEPORT`` (the kernel spreads connections over them). The process the
user starts is the *primary*: it owns everything that writes (uploads, annotations, added
sources, the catalog store), serves Flight and HTTP as a single server does, and starts the
workers as fresh interpreters (``python -m tensor_server`` with the same arguments and a role
in ``WORKER_ENV``: never a fork of a threaded process). A worker serves HTTP reads from a
catalog of its own (the same roots, scanned by it: the primary's catalog store is a DuckDB file
only one process may open), read-only, and reads the chunk cache every process writes
(``cache/peers.py``). What only the primary holds (READY uploads, paths added with
``add_source``) it publishes in a manifest file its workers follow (``service/worker_catalog.py``:
``publish_catalog``, ``follow_catalog``), so they serve it under the same ids. What a worker
cannot open at all, the annotations (the primary's DuckDB file), it forwards to the primary's
loopback forward door as the request came (``open_forward_door``, ``http/forward.py``).

Flight stays on the primary: pyarrow's Flight server binds without ``SO_REUSEPORT`` (measured
on pyarrow 26: a second server on the port fails with "Address already in use"), so a worker
tells clients the primary's Flight location.

The primary reads each worker's stdout for one line, ``READY``, then until it ends: a worker
whose stdout ends has exited; one that exits before it is ready fails the start (every other
worker is stopped, nothing is left running), one that exits later is restarted after a backoff
that doubles from ``RESTART_FIRST_SECONDS`` to ``RESTART_MAX_SECONDS``. A worker reads its stdin
until it ends, so it stops when the primary dies however it dies (its pipe closes).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "WORKER_ENV",
    "WorkerRole",
    "Workers",
    "worker_role",
    "announce_ready",
    "as_worker",
    "primary_workers",
    "merge_worker_metrics",
    "cache_peers",
    "render_specs_folder",
    "publish_catalog",
    "follow_catalog",
    "follow_grants",
    "forward_to_primary",
    "open_forward_door",
    "refuse_workers",
    "serve_as_worker",
]

log = logging.getLogger("tensor_server")

#: the environment variable that makes ``serve`` a worker: its role as JSON
WORKER_ENV = "TENSOR_SERVER_WORKER"
#: the line a worker prints on stdout once its HTTP door listens (then its metrics port, if any)
READY = "READY"
RESTART_FIRST_SECONDS = 0.5
RESTART_MAX_SECONDS = 10.0
#: a worker up this long has its backoff reset: its next death is restarted at once-ish
STABLE_SECONDS = 60.0
#: how long a stop waits for the workers to drain before it kills them
STOP_SECONDS = 5.0


@dataclass(frozen=True)
class WorkerRole:
    """What the primary tells a worker: its slot (1..count-1), how many processes serve, the
    ports they share, the primary's Flight location, its chunk cache folder (None: uncached),
    whether it serves metrics (then the worker serves its own on a loopback port, which the
    primary's door scrapes: http/metrics_merge.py) and the port of its forward door."""

    slot: int
    count: int
    http_port: int
    flight_port: int
    primary: str
    cache_dir: str | None
    metrics: bool
    #: the primary's loopback port annotation requests are forwarded to (``open_forward_door``)
    forward_port: int | None = None

    def cache_folder(self) -> Path | None:
        from tensor_server.cache.peers import process_folder

        return None if self.cache_dir is None else process_folder(Path(self.cache_dir), self.slot)


def worker_role() -> WorkerRole | None:
    """This process's role when its primary started it, else None."""
    text = os.environ.get(WORKER_ENV)
    return WorkerRole(**json.loads(text)) if text else None


def announce_ready(metrics_port: int | None) -> None:
    """Say READY (and the port of this worker's metrics door) to the primary, and stop (as
    SIGTERM does) when the primary's end of stdin closes: a worker never outlives its primary."""

    def watch_primary() -> None:
        while os.read(0, 4096):  # the raw fd: a buffered reader's lock would hang the exit
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch_primary, name="primary-watch", daemon=True).start()
    print(READY if metrics_port is None else f"{READY} {metrics_port}", flush=True)


class Workers:
    """The primary's workers: ``start`` them (None, or why one could not start), each watched
    and restarted when it dies; ``stop`` drains them (SIGTERM, then SIGKILL after STOP_SECONDS)."""

    def __init__(self, argv: list[str], count: int, **role: object) -> None:
        self._argv = [sys.executable, "-m", "tensor_server", *argv]
        self._count = count
        self._role = role
        self._procs: dict[int, subprocess.Popen] = {}
        self._metrics_ports: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def metrics_ports(self) -> list[tuple[str, int]]:
        """(process label, metrics port) of each worker that said one."""
        with self._lock:
            return [(f"worker-{slot}", port) for slot, port in sorted(self._metrics_ports.items())]

    def start(self) -> str | None:
        watchers = []
        for slot in range(1, self._count):
            proc = self._spawn(slot)
            if proc is None or not self._wait_ready(slot, proc):
                self.stop()
                return (
                    f"worker {slot} of {self._count} did not start "
                    f"(exit code {proc.poll() if proc else None}; its lines above say why)"
                )
            watchers.append(threading.Thread(target=self._watch, args=(slot, proc), name=f"worker-{slot}", daemon=True))
        for thread in watchers:
            thread.start()
        return None

    def _spawn(self, slot: int) -> subprocess.Popen | None:
        """Worker ``slot`` started, or None once the stop has begun (nothing is left behind)."""
        role = WorkerRole(slot=slot, count=self._count, **self._role)  # type: ignore[arg-type]
        env = {**os.environ, WORKER_ENV: json.dumps(asdict(role))}
        with self._lock:
            if self._stopping.is_set():
                return None
            # a session of its own: a Ctrl-C reaches the primary only, which drains the workers
            proc = self._procs[slot] = subprocess.Popen(
                self._argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
            )
        return proc

    def _watch(self, slot: int, proc: subprocess.Popen | None) -> None:
        """Until the stop: wait for the worker to end (its stdout closes), then start it again."""
        backoff = RESTART_FIRST_SECONDS
        while proc is not None:
            started = time.monotonic()
            assert proc.stdout is not None
            for line in proc.stdout:  # a restarted worker's READY, then nothing until it ends
                self._ready(slot, line)
            code = proc.wait()
            _close_pipes(proc)
            if self._stopping.is_set():
                return
            if time.monotonic() - started > STABLE_SECONDS:
                backoff = RESTART_FIRST_SECONDS
            log.warning("worker %d (pid %d) exited with %s; restarting it in %.1f s", slot, proc.pid, code, backoff)
            if self._stopping.wait(backoff):
                return
            backoff = min(backoff * 2, RESTART_MAX_SECONDS)
            proc = self._spawn(slot)

    def _wait_ready(self, slot: int, proc: subprocess.Popen) -> bool:
        """Whether the worker said READY (however long its first scan of the roots takes: the
        primary serves meanwhile); False when it exited first."""
        assert proc.stdout is not None
        return any(self._ready(slot, line) for line in proc.stdout)

    def _ready(self, slot: int, line: str) -> bool:
        """Whether ``line`` is READY; remembers the metrics port it names."""
        words = line.split()
        if not words or words[0] != READY:
            return False
        if len(words) > 1 and words[1].isdigit():
            with self._lock:
                self._metrics_ports[slot] = int(words[1])
        return True

    def stop(self) -> None:
        """SIGTERM every worker, wait up to STOP_SECONDS for them to drain, kill the rest."""
        self._stopping.set()
        with self._lock:  # no spawn after this (``_spawn``)
            procs = list(self._procs.values())
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker pid %d did not stop in %.0f s; killed", proc.pid, STOP_SECONDS)
                proc.kill()
                proc.wait()
        # the pipes are each watcher's to close (closing one under its read would raise there)


def _close_pipes(proc: subprocess.Popen) -> None:
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:
                pass


def primary_workers(
    argv: list[str], count: int, runtime, location: str, flight_port: int, http_port: int, cache, forward_port: int
):
    """The primary's workers (not started yet), told what they share with it."""
    return Workers(
        list(argv),
        count,
        http_port=http_port,
        flight_port=flight_port,
        primary=location,
        cache_dir=str(cache.dir) if cache is not None else None,
        metrics=runtime.settings.metrics_port is not None,
        forward_port=forward_port,
    )


def open_forward_door(runtime, http):  # HttpFrontEnd
    """The primary's door its workers forward what only it answers to (annotations:
    ``http/forward.py``): its HTTP door's app, so the same rules judge a forwarded request,
    on a loopback port of its own (the shared port would hand it to any process)."""
    from tensor_server.http.app import HttpFrontEnd

    door = HttpFrontEnd(http.app, "127.0.0.1", 0, tls=runtime.tls)
    door.start()
    return door


def forward_to_primary(app, role: WorkerRole, tls):
    """A worker's HTTP app, answering what only the primary answers with the primary's answer."""
    from tensor_server.http.forward import ForwardToPrimary

    if role.forward_port is None:
        return app
    cafile = None if tls is None else str(tls.cert_path)
    return ForwardToPrimary(app, role.forward_port, scheme="https" if tls is not None else "http", cafile=cafile)


def merge_worker_metrics(runtime, workers: Workers) -> None:
    """The primary's metrics door answers for every process from now on (http/metrics_merge.py)."""
    from tensor_server.http.metrics_merge import MergedRegistry

    runtime.metrics.registry = MergedRegistry(
        runtime.metrics.registry,
        workers.metrics_ports,
        token=runtime.settings.token,
        cafile=str(runtime.tls.cert_path) if runtime.tls is not None else None,
    )


def refuse_workers(settings, count: int) -> bool:
    """Whether ``--workers count`` cannot be (said on stderr); more workers than cores is
    allowed and said."""
    if settings.http_port is None:
        print(
            "serve: --workers serves HTTP from several processes: it needs --http-port "
            "(Flight is served by the first process only; docs/operating.md)",
            file=sys.stderr,
        )
        return True
    cores = os.cpu_count() or 1
    if count > cores:
        print(f"serve: --workers {count} is more than the {cores} cores: the processes share them", file=sys.stderr)
    return False


def as_worker(settings, role: WorkerRole) -> None:
    """A worker's settings: its primary's ports, read-only, no write dir or annotations, its
    metrics door (when the primary has one) on a loopback port of its own."""
    settings.port, settings.http_port = role.flight_port, role.http_port
    settings.read_only, settings.writable, settings.write_dir = True, False, None
    settings.metrics_port, settings.metrics_host = (0 if role.metrics else None), "127.0.0.1"


def cache_peers(folder: str, role: WorkerRole | None, count: int):  # PeerSegments | None
    """The other processes' cache folders a process of a ``count``-process server reads;
    the primary first removes the folders of workers it no longer has."""
    from tensor_server.cache.peers import PeerSegments, clear_stale_folders, peer_folders

    cache_dir = Path(role.cache_dir) if role is not None and role.cache_dir else Path(folder)
    if role is None:
        clear_stale_folders(cache_dir, count)
    return PeerSegments(peer_folders(cache_dir, role.slot if role else 0, count)) if count > 1 else None


def shared_folder(role: WorkerRole | None, cache) -> Path:
    """The folder every process of a server shares files in: the primary's chunk cache folder
    (which workers are told), else the default cache folder (the same for every process: they
    share the environment)."""
    from tensor_server.config import default_cache_dir

    if role is not None:
        root = Path(role.cache_dir) if role.cache_dir else None
    else:
        root = Path(cache.dir) if cache is not None else None
    return root or default_cache_dir()


def render_specs_folder(role: WorkerRole | None, cache) -> Path:
    """The folder every process of a server keeps render specs in (``render.spec_store``)."""
    return shared_folder(role, cache) / "render-specs"


def catalog_manifest(role: WorkerRole | None, cache, flight_port: int) -> Path:
    """The file the primary tells its workers what only it holds in (``service/worker_catalog.py``):
    named by the primary's Flight port, so two servers sharing the default folder never share it."""
    return shared_folder(role, cache) / f"workers-catalog-{flight_port}.json"


def publish_catalog(runtime, cache, flight_port: int):  # ManifestPublisher
    """The primary's manifest, written now (before any worker reads it) and kept current."""
    from tensor_server.service.worker_catalog import ManifestPublisher

    publisher = ManifestPublisher(
        runtime.catalog,
        runtime.uploads,
        catalog_manifest(None, cache, flight_port),
        runtime.catalog_verbs.dropped.added_urls,
    )
    publisher.start()
    runtime.catalog_written = publisher.flush
    return publisher


def follow_catalog(role: WorkerRole, catalog):  # ManifestFollower
    """A worker serves its primary's READY uploads and added paths and URLs, from before its
    first scan; its ``Access`` checks their grants from ``follower.uploads`` (``follow_grants``)."""
    from tensor_server.service.worker_catalog import ManifestFollower

    follower = ManifestFollower(catalog, catalog_manifest(role, None, role.flight_port))
    follower.start()
    return follower


def follow_grants(runtime, follower) -> None:
    """A worker's read rule (``Access``) sees the primary's uploads, their owners and grants,
    as the manifest lists them: a private upload is read by the same callers on every process."""
    runtime.access.uploads = follower.uploads


def serve_as_worker(role: WorkerRole, http, catalog, settings, metrics) -> int:
    """A worker serves until SIGTERM (or its primary's end: ``announce_ready``); its catalog
    rescans as the primary's does. Its stdout carries READY only."""
    from tensor_server.core.downsample import warm_up
    from tensor_server.service.worker_catalog import MAX_ENTRIES

    catalog.start_periodic_rescan(settings.rescan_seconds)
    catalog.unknown_hint = (
        f"; this is worker {role.slot} of a `serve --workers {role.count}` server, which serves the roots "
        f"and the READY uploads and added paths and URLs its first process lists; past the {MAX_ENTRIES:,} of each "
        f"listed, one is served by the first process only (over Flight at {role.primary}; docs/serving.md)"
    )
    print(
        f"tensor-server worker {role.slot} of {role.count} (pid {os.getpid()}) serving HTTP on {http.url}",
        file=sys.stderr,
    )
    announce_ready(metrics.port if metrics is not None else None)
    warm_up()
    while True:
        time.sleep(3600)
