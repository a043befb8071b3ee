"""Operability: Prometheus instruments, per-request timing, request ids and the request log.

Every instrument of the server is defined here, once, with bounded labels: the door
(``flight``, ``http``, ``in-process``), the door's call (Flight verb or HTTP route class, ``CALLS``), the runtime verb
and action name (from the action registry), the engine's read path (``core.engine.READ_PATHS``
plus ``cache``), the cache tier, the format name (capped), the error code of the taxonomy.
Never an array id, a path or client text: a label outside its set is ``other``.

Who records what:

* a door opens a **request** (``Metrics.begin``/``end``): its id, the
  door's per-call count and latency, the request log line; an action it runs is counted with
  it, by name; a refusal the door makes before the runtime is asked (the HTTP browser guard's)
  is counted by kind (``Metrics.refused``);
* the runtime's verbs are decorated (``@verb("chunk")``, ``@part("lookup")``): each verb's
  count by outcome and latency, and the **timing parts** of the current request — lookup,
  cache, decode, reduce, encode — which HTTP sends as ``Server-Timing`` and ``server_stats``
  sums per door;
* the read engine tells ``Metrics.on_read`` which path served each computed read (a chunk
  verb that computed nothing was a cache hit), which also feeds the catalog's
  ``decode_rates`` table (full-resolution decodes only);
* state that already has an owner (cache statistics, the catalog, uploads, the process) is
  read at scrape time by a collector, never on the read path.

The per-request record lives in a ``contextvars.ContextVar`` set by the door: the runtime and
the engine's observer fill it on the same thread (and in Starlette's worker threads, which
copy the context). With ``--metrics-port`` unset the Prometheus instruments are not even
built (``enabled`` False): requests, parts, Server-Timing and the log line still work, and
the call counts (requests, actions and refusals: ``calls``, ``refusals``) are still kept.
They are the server's one call counter: ``server_stats`` shows them and tests prove fast paths
with them, so every door counts its calls here and nowhere else.

The metrics door (``http/metrics_door.py``) serves ``/metrics`` of ``Metrics.registry`` on a
port of its own (loopback by default, so usage is not exposed on a public door); off loopback
it refuses to start without the server token, and takes the token on every scrape when the
server has one.
"""

from __future__ import annotations

import bisect
import contextvars
import functools
import itertools
import logging
import os
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tensor_server.errors import TensorServerError
from tensor_server.service.request_log import ACCESS_LOG, REQUEST_LINES

if TYPE_CHECKING:  # pragma: no cover
    from prometheus_client import CollectorRegistry

    from tensor_server.service.runtime import ServingRuntime

__all__ = [
    "Metrics",
    "RequestTiming",
    "verb",
    "part",
    "timing",
    "current",
    "code_of",
    "PARTS",
    "CALLS",
    "REFUSALS",
    "ACCESS_LOG",
]


#: per door (``flight``, ``http``; ``in-process`` for verbs called without one), the calls it may name (a door adding a route class adds it here)
CALLS = {
    "flight": ("GetFlightInfo", "ListFlights", "GetSchema", "DoGet", "DoPut", "ListActions", "DoAction"),
    "http": (
        "zarr_index",
        "zarr_metadata",
        "zarr_chunk",
        "zarr_other",
        "iiif_info",
        "iiif_image",
        "dzi",
        "dzi_tile",
        "catalog_page",
        "viewer_page",
        "viewer_assets",
        "healthz",
        "other",
    ),
    "in-process": (),
}
#: per door, the refusals it makes itself, before the runtime is asked (the runtime's own
#: refusals are errors of the taxonomy, counted by code with the request)
REFUSALS = {"http": ("bad_host", "cross_origin", "unauthorized")}
#: where a request's time went (Server-Timing names, in this order)
PARTS = ("lookup", "cache", "decode", "reduce", "encode")
#: the part each engine path's time is counted in: ``decode`` reads source bytes as they
#: are; ``reduce`` computes a reduction (a streamed one overlaps its units' decoding)
_PART_OF_PATH = {
    "direct": "decode",
    "decimated": "decode",
    "upstream": "decode",
    "closed_form": "reduce",
    "streamed": "reduce",
    "cache_sourced": "reduce",
}
#: latency buckets (seconds): a cached chunk is ~0.1-1 ms, a cold scaled read seconds
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: distinct format labels kept; later ones count as ``other``
MAX_FORMATS = 64
#: a client's X-Request-Id worth echoing; fullmatch of one class, at most 64 long: bounded work on any header
_INCOMING_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_ID_PREFIX = os.urandom(3).hex()
_ids = itertools.count(1)

_current: contextvars.ContextVar[RequestTiming | None] = contextvars.ContextVar("tensor_server_request", default=None)


def current() -> RequestTiming | None:
    """The request being served on this thread (None outside one)."""
    return _current.get()


def code_of(exc: BaseException) -> str:
    """The taxonomy's code of an error (anything else is INTERNAL)."""
    return exc.code if isinstance(exc, TensorServerError) else "INTERNAL"


class RequestTiming:
    """One request: its id, door and call, outcome, and the seconds of each part."""

    __slots__ = (
        "id",
        "door",
        "call",
        "action",
        "t0",
        "parts",
        "reads",
        "code",
        "status",
        "nbytes",
        "peer",
        "target",
        "_token",
    )

    def __init__(self, door: str, call: str, request_id: str | None = None) -> None:
        self.id = request_id if request_id and _INCOMING_ID.fullmatch(request_id) else f"{_ID_PREFIX}-{next(_ids):x}"
        self.door, self.call = door, call
        #: the action this request runs (its registry name, or ``unknown``), counted with it
        self.action: str | None = None
        self.t0 = time.perf_counter()
        self.parts = dict.fromkeys(PARTS, 0.0)
        self.reads = 0
        self.code = "OK"
        self.status: int | None = None
        self.nbytes = 0
        self.peer = ""
        self.target = ""
        self._token: contextvars.Token | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def failed(self, exc: BaseException) -> None:
        self.code = code_of(exc)

    def server_timing(self) -> str:
        """The ``Server-Timing`` header value: every part, then ``total`` (milliseconds)."""
        total = self.elapsed()
        return ", ".join([f"{k};dur={v * 1e3:.3f}" for k, v in self.parts.items()] + [f"total;dur={total * 1e3:.3f}"])


class _Timer:
    """``with timing("encode"):`` adds the block's seconds to the current request's part."""

    __slots__ = ("name", "rq", "t0")

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> _Timer:
        self.rq = _current.get()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.rq is not None:
            self.rq.parts[self.name] += time.perf_counter() - self.t0


def timing(name: str) -> _Timer:
    """A block's seconds counted in the current request's part ``name`` (``PARTS``)."""
    return _Timer(name)


# ---- decorators for the runtime's verbs ------------------------------------------------------
def part(name: str) -> Callable:
    """A runtime method whose time is the current request's part ``name`` (lookup)."""

    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            rq = _current.get()
            if rq is None:
                return fn(self, *args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(self, *args, **kwargs)
            finally:
                rq.parts[name] += time.perf_counter() - t0

        return wrapper

    return deco


def verb(
    name: str, *, cancelled_arg: int | None = None, action_arg: int | None = None, remainder: str | None = None
) -> Callable:
    """A runtime verb, counted by outcome and timed (``self.metrics``). ``cancelled_arg``:
    the position of its ``cancelled`` callable (an error after the client went counts as
    CANCELLED); ``action_arg``: the position of an action name (the label is the registry's
    name, or ``unknown``); ``remainder``: the part the verb's time not attributed to another
    part goes to (``cache`` for chunks: the store's look-up and write), and a chunk verb that
    computed nothing is counted as read from the cache."""

    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            action = None if action_arg is None else _action_name(args[action_arg] if len(args) > action_arg else "")
            label = name if action is None else f"action:{action}"
            return self.metrics.run_verb(label, fn, self, args, kwargs, cancelled_arg, remainder, action)

        return wrapper

    return deco


_ACTION_NAMES: frozenset[str] | None = None


def _action_name(action: object) -> str:
    """The registry's name of ``action``, or ``unknown`` (a bounded label)."""
    global _ACTION_NAMES
    if _ACTION_NAMES is None:
        from tensor_server.service.actions import ACTIONS

        _ACTION_NAMES = frozenset(a.name for a in ACTIONS)
    return str(action) if action in _ACTION_NAMES else "unknown"


class Metrics:
    """The instruments of one runtime (its own registry: two servers in a process, as in
    tests, count apart). ``enabled`` builds the Prometheus instruments."""

    def __init__(self, runtime: ServingRuntime | None = None, *, enabled: bool = False) -> None:
        self.runtime = runtime
        self.enabled = enabled
        self._lock = threading.Lock()
        #: exports running now (the export action), a gauge read at scrape time
        self.exports_running = 0
        #: door -> [requests, total seconds, *part seconds] (server_stats' breakdown)
        self._totals: dict[str, list[float]] = {}
        #: (family, *label values) -> value, and -> [per-bucket counts..., +Inf count, sum]:
        #: plain numbers under ``_lock``, one acquisition per event (a prometheus_client
        #: child costs a lock per increment: ~10 of them per cached chunk showed in its p50),
        #: turned into families at scrape time by ``_InstrumentCollector``. The call counts
        #: (requests, actions, refusals) are kept even when ``enabled`` is False.
        self._counters: dict[tuple, float] = {}
        self._hists: dict[tuple, list[float]] = {}
        self._formats: dict[str, str] = {}
        self.registry: CollectorRegistry | None = None
        if enabled:
            self._build()

    # ---- instruments ----------------------------------------------------------------------
    def _build(self) -> None:
        from prometheus_client import CollectorRegistry, ProcessCollector

        reg = self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=reg)  # RSS, open file handles, CPU seconds
        reg.register(_InstrumentCollector(self))
        reg.register(_StateCollector(self))

    def _add(self, key: tuple, value: float = 1.0) -> None:
        """Counter ``key`` += ``value`` (the caller holds ``_lock``)."""
        self._counters[key] = self._counters.get(key, 0.0) + value

    def _observe(self, key: tuple, seconds: float) -> None:
        """Histogram ``key`` observes ``seconds`` (the caller holds ``_lock``)."""
        row = self._hists.get(key)
        if row is None:
            row = self._hists[key] = [0.0] * (len(_BUCKETS) + 2)
        row[bisect.bisect_left(_BUCKETS, seconds)] += 1
        row[-1] += seconds

    # ---- requests (the doors) ---------------------------------------------------------------
    def begin(self, door: str, call: str, request_id: str | None = None) -> RequestTiming:
        """Open a request on this thread; ``end`` closes it (same thread or task)."""
        if call not in CALLS.get(door, ()):
            call = "other"
        rq = RequestTiming(door, call, request_id)
        rq._token = _current.set(rq)
        return rq

    def end(self, rq: RequestTiming) -> float:
        """Close ``rq``: count it (and the action it ran), add its parts to the totals, write
        its log line."""
        total = rq.elapsed()
        if rq._token is not None:
            try:
                _current.reset(rq._token)
            except ValueError:  # closed in another context than it was opened in
                _current.set(None)
            rq._token = None
        with self._lock:
            row = self._totals.get(rq.door)
            if row is None:
                row = self._totals[rq.door] = [0.0] * (2 + len(PARTS))
            row[0] += 1
            row[1] += total
            for i, v in enumerate(rq.parts.values()):
                row[2 + i] += v
            key = ("requests", rq.door, rq.call, rq.code)  # _add, inlined: every request pays it
            counters = self._counters
            counters[key] = counters.get(key, 0.0) + 1.0
            if rq.action is not None:
                self._add(("actions", rq.door, rq.action, rq.code))
            if self.enabled:
                self._observe(("request_seconds", rq.door, rq.call), total)
                for k, v in rq.parts.items():
                    if v:
                        self._add(("part_seconds", rq.door, k), v)
        if ACCESS_LOG.isEnabledFor(logging.INFO):
            _log_request(rq, total)
        return total

    def refused(self, door: str, kind: str) -> None:
        """A refusal ``door`` made itself (``REFUSALS``), counted when it is made: a refusal is
        never a hot path, and a client that sees it can read the count at once."""
        if kind not in REFUSALS.get(door, ()):
            kind = "other"
        with self._lock:
            self._add(("refusals", door, kind))

    def calls(self, code: str | None = None) -> dict[str, Counter[str]]:
        """Per door, its requests by call (``CALLS``) and the actions it ran as
        ``action:<name>`` (actions called without a door count under ``in-process``); only
        those of outcome ``code`` when given. A door or call not seen counts 0. What
        ``server_stats`` shows as ``calls``, and what tests prove fast paths with."""
        out: defaultdict[str, Counter[str]] = defaultdict(Counter)
        with self._lock:
            counters = list(self._counters.items())
        for key, value in counters:
            if code is not None and key[-1] != code:
                continue
            if key[0] == "requests":
                out[key[1]][key[2]] += int(value)
            elif key[0] == "actions":
                out[key[1]][f"action:{key[2]}"] += int(value)
        return out

    def refusals(self) -> dict[str, Counter[str]]:
        """Per door, the refusals it made itself by kind (``REFUSALS``); 0 when not seen."""
        out: defaultdict[str, Counter[str]] = defaultdict(Counter)
        with self._lock:
            counters = list(self._counters.items())
        for key, value in counters:
            if key[0] == "refusals":
                out[key[1]][key[2]] += int(value)
        return out

    def breakdown(self) -> dict[str, dict[str, float]]:
        """Per door: requests, their total seconds and the seconds of each part (server_stats)."""
        with self._lock:
            rows = {door: list(row) for door, row in self._totals.items()}
        return {
            door: {"requests": int(row[0]), "seconds": row[1], **dict(zip(PARTS, row[2:]))}
            for door, row in rows.items()
        }

    # ---- verbs (the runtime) ----------------------------------------------------------------
    def run_verb(
        self,
        label: str,
        fn: Callable,
        obj: Any,
        args: tuple,
        kwargs: dict,
        cancelled_arg: int | None,
        remainder: str | None,
        action: str | None = None,
    ) -> Any:
        """Run verb ``fn``, counting it (``action``: the action it is, counted with the
        door's request, or here for a call without a door)."""
        rq = _current.get()
        token = None
        if rq is None:  # an in-process call: a request of its own, so parts still add up
            rq = RequestTiming("in-process", label)
            token = _current.set(rq)
        if action is not None and rq.action is None:
            rq.action = action
        parts = rq.parts
        before = sum(parts.values())
        reads = rq.reads
        code = "OK"
        t0 = time.perf_counter()
        try:
            return fn(obj, *args, **kwargs)
        except BaseException as exc:
            code = code_of(exc)
            cancelled = kwargs.get("cancelled")
            if cancelled is None and cancelled_arg is not None and len(args) > cancelled_arg:
                cancelled = args[cancelled_arg]
            if cancelled is not None and cancelled():
                code = "CANCELLED"
            raise
        finally:
            seconds = time.perf_counter() - t0
            if remainder is not None:
                parts[remainder] += max(0.0, seconds - (sum(parts.values()) - before))
            in_process_action = token is not None and action is not None
            if self.enabled or in_process_action:
                with self._lock:
                    if in_process_action:  # no door request to count it with
                        self._add(("actions", "in-process", action, code))
                    if self.enabled:
                        if remainder is not None and code == "OK" and rq.reads == reads:
                            self._add(("reads", "cache"))
                        self._add(("verbs", label, code))
                        self._observe(("verb_seconds", label), seconds)
            if token is not None:
                _current.reset(token)

    def on_read(self, tensor: Any, path: str, seconds: float, nbytes: int) -> None:
        """The read engine's observer (``ReadEngine.on_read``)."""
        rq = _current.get()
        if rq is not None:
            rq.parts[_PART_OF_PATH.get(path, "decode")] += seconds
            rq.reads += 1
        if path == "direct" and self.runtime is not None:
            self.runtime.catalog.decode_rates.record(tensor.array_id, nbytes, seconds)
        if not self.enabled:
            return
        if path not in _PART_OF_PATH:
            path = "other"
        fmt = self._format_of(tensor) if path == "direct" else None
        with self._lock:
            self._add(("reads", path))
            self._add(("read_seconds", path), seconds)
            self._add(("read_bytes", path), nbytes)
            if fmt is not None:
                self._add(("decode_seconds", fmt), seconds)
                self._add(("decode_bytes", fmt), nbytes)

    def _format_of(self, tensor: Any) -> str:
        """The catalog's source type of ``tensor`` (bounded: MAX_FORMATS names, then other)."""
        from tensor_server.core.identity import ArrayId

        try:
            source_id = ArrayId.parse(tensor.array_id).source_id
        except Exception:  # a label, never a failed read
            return "other"
        fmt = self._formats.get(source_id)
        if fmt is None:
            try:
                fmt = "other" if self.runtime is None else str(self.runtime.catalog.get_record(source_id).type)
            except Exception:
                fmt = "other"
            if fmt not in self._formats.values() and len(set(self._formats.values())) >= MAX_FORMATS:
                fmt = "other"
            if len(self._formats) > 4096:
                self._formats.clear()
            self._formats[source_id] = fmt
        return fmt

    def uploaded(self, nbytes: int) -> None:
        if self.enabled:
            with self._lock:
                self._add(("upload_bytes",), nbytes)

    def exported(self, nbytes: int) -> None:
        """Bytes an export wrote (its progress records' count, as they come)."""
        if self.enabled:
            with self._lock:
                self._add(("export_bytes",), nbytes)

    def export_started(self, delta: int) -> None:
        """+1 when an export starts, -1 when it ends (the ``exports_running`` gauge)."""
        with self._lock:
            self.exports_running += delta


def _log_request(rq: RequestTiming, total: float) -> None:
    fields = {
        "request_id": rq.id,
        "door": rq.door,
        "call": rq.call,
        "code": rq.code,
        "status": rq.status,
        "ms": round(total * 1e3, 3),
        "bytes": rq.nbytes,
        "peer": rq.peer[:64],
        "target": rq.target[:200],
        **{f"{k}_ms": round(v * 1e3, 3) for k, v in rq.parts.items() if v},
    }
    REQUEST_LINES.add(fields)


#: family -> (kind, help, label names): what ``Metrics`` counts (prefixed ``tensor_server_``)
FAMILIES = {
    "requests": (
        "counter",
        "Requests by door, call (Flight verb or HTTP route class) and outcome (error code)",
        ("door", "call", "code"),
    ),
    "request_seconds": ("histogram", "Request latency by door and call", ("door", "call")),
    "actions": (
        "counter",
        "Actions by door (in-process: called without one), registry name and outcome (error code)",
        ("door", "action", "code"),
    ),
    "refusals": (
        "counter",
        "Requests a door refused itself, by kind (HTTP browser guard: bad_host, cross_origin, unauthorized)",
        ("door", "kind"),
    ),
    "part_seconds": (
        "counter",
        "Seconds of requests spent in each part (Server-Timing: lookup, cache, decode, reduce, encode)",
        ("door", "part"),
    ),
    "verbs": ("counter", "Runtime verbs (and actions) by outcome", ("verb", "code")),
    "verb_seconds": ("histogram", "Runtime verb latency", ("verb",)),
    "reads": ("counter", "Reads by the path that served them (cache: a chunk the cache held whole)", ("path",)),
    "read_seconds": ("counter", "Seconds of computed reads by path", ("path",)),
    "read_bytes": ("counter", "Bytes made by computed reads by path", ("path",)),
    "decode_seconds": ("counter", "Seconds of full-resolution source decodes by format", ("format",)),
    "decode_bytes": ("counter", "Bytes of full-resolution source decodes by format", ("format",)),
    "upload_bytes": ("counter", "Pixel bytes written by upload chunk puts", ()),
    "export_bytes": ("counter", "Bytes written by exports (the export action)", ()),
}
#: exposed names (a counter's samples end in ``_total``)
_NAMES = {
    "requests": "requests",
    "request_seconds": "request_seconds",
    "actions": "actions",
    "refusals": "refusals",
    "part_seconds": "request_part_seconds",
    "verbs": "verb_calls",
    "verb_seconds": "verb_seconds",
    "reads": "reads",
    "read_seconds": "read_seconds",
    "read_bytes": "read_bytes",
    "decode_seconds": "decode_seconds",
    "decode_bytes": "decode_bytes",
    "upload_bytes": "upload_bytes",
    "export_bytes": "export_bytes",
}


class _InstrumentCollector:
    """``Metrics``' counters and histograms as Prometheus families, at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        m = self.metrics
        with m._lock:
            counters = dict(m._counters)
            hists = {k: list(v) for k, v in m._hists.items()}
        sums: dict[str, CounterMetricFamily] = {}
        histograms: dict[str, HistogramMetricFamily] = {}
        for family, (kind, text, labels) in FAMILIES.items():
            name = f"tensor_server_{_NAMES[family]}"
            if kind == "counter":
                sums[family] = CounterMetricFamily(name, text, labels=list(labels))
            else:
                histograms[family] = HistogramMetricFamily(name, text, labels=list(labels))
        for (family, *label_values), value in counters.items():
            sums[family].add_metric(label_values, value)
        for (family, *label_values), row in hists.items():
            cumulative, buckets = 0.0, []
            for bound, n in zip((*map(str, _BUCKETS), "+Inf"), row[:-1]):
                cumulative += n
                buckets.append((bound, cumulative))
            histograms[family].add_metric(label_values, buckets, sum_value=row[-1])
        yield from ({**sums, **histograms}[family] for family in FAMILIES)


class _StateCollector:
    """What other owners count, read at scrape time: the engine's admission queue, the
    chunk cache per tier, the precacher, the catalog and discovery, uploads, the decode-rate
    table."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> list:
        return []  # unchecked: the families depend on what the runtime has (a cache or not)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        rt = self.metrics.runtime
        if rt is None:
            return
        cat = rt.catalog
        yield GaugeMetricFamily("tensor_server_catalog_sources", "Sources in the catalog", value=len(cat))
        yield GaugeMetricFamily(
            "tensor_server_catalog_scan_in_progress",
            "1 while discovery scans the roots",
            value=1 if cat.scan_in_progress else 0,
        )
        yield from _discovery_families(cat.discovery_progress(), len(cat.skipped))
        yield GaugeMetricFamily(
            "tensor_server_catalog_generation", "Catalog generation (moves on every change)", value=cat.generation
        )
        yield GaugeMetricFamily(
            "tensor_server_decode_rate_rows",
            "Tensors in the decode_rates table",
            value=len(cat.decode_rates.snapshot()),
        )
        engine = rt.engine
        if engine.max_computes:
            adm = dict(engine.admission)
            yield GaugeMetricFamily(
                "tensor_server_admission_slots", "Chunk computations allowed at once", value=engine.max_computes
            )
            yield GaugeMetricFamily(
                "tensor_server_admission_waiting", "Computations waiting for a slot now", value=adm["waiting"]
            )
            yield CounterMetricFamily(
                "tensor_server_admission_waits", "Computations that waited for a slot", value=adm["waits"]
            )
            yield CounterMetricFamily(
                "tensor_server_admission_wait_seconds", "Seconds computations waited", value=adm["wait_seconds"]
            )
            yield CounterMetricFamily(
                "tensor_server_admission_refused",
                "Computations refused after waiting (UNAVAILABLE, retryable)",
                value=adm["refused"],
            )
        stats = rt.cache_stats()
        if stats is not None:
            pools = stats["pool_stats"]
            hits = CounterMetricFamily("tensor_server_cache_hits", "Chunk cache hits by tier", labels=["tier"])
            hits.add_metric(["memory"], pools["memory"]["hits"])
            hits.add_metric(["file"], pools["file"]["hits"])
            hits.add_metric(["uniform"], max(0, stats["hits"] - pools["memory"]["hits"] - pools["file"]["hits"]))
            yield hits
            size = GaugeMetricFamily("tensor_server_cache_bytes", "Chunk cache bytes held by tier", labels=["tier"])
            size.add_metric(["memory"], pools["memory"]["bytes"])
            size.add_metric(["file"], pools["file"]["bytes"])
            yield size
            for key, text in (
                ("misses", "Chunk cache misses (computed)"),
                ("evictions", "Segments evicted"),
                ("pending_waits", "Reads that waited for another's computation of one chunk"),
                ("oversized_skips", "Chunks larger than the cache budget"),
                ("corrupt_entries", "Entries dropped on failed verification"),
                ("write_errors", "Writes the disk refused"),
            ):
                yield CounterMetricFamily(f"tensor_server_cache_{key}", text, value=stats[key])
            yield GaugeMetricFamily(
                "tensor_server_cache_entries", "Entries in the file tier", value=stats["total_entries"]
            )
            yield GaugeMetricFamily("tensor_server_cache_max_bytes", "File-tier budget", value=stats["max_bytes"])
            precache = stats.get("precache")
            if precache:
                fam = CounterMetricFamily("tensor_server_precache", "Precacher chunks by outcome", labels=["outcome"])
                for key, value in precache.items():
                    fam.add_metric([str(key)], value)
                yield fam
        yield from _remote_families()
        if rt.uploads is not None:
            yield GaugeMetricFamily(
                "tensor_server_uploads_pending", "Uploads in flight (PENDING)", value=rt.uploads.pending_count()
            )
        yield GaugeMetricFamily(
            "tensor_server_exports_running", "Exports in flight (the export action)", value=rt.metrics.exports_running
        )


def _remote_families() -> Iterator[Any]:
    """The remote byte store of images opened by URL (``adapters/_remote_bytes.py``)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from tensor_server.adapters._remote_bytes import remote_bytes

    stats = remote_bytes().stats()
    yield CounterMetricFamily("tensor_server_remote_requests", "Requests sent to remote hosts", value=stats["requests"])
    yield CounterMetricFamily("tensor_server_remote_hits", "Remote ranges the byte cache answered", value=stats["hits"])
    yield GaugeMetricFamily(
        "tensor_server_remote_cache_bytes", "Bytes held by the remote byte cache", value=stats["bytes"]
    )
    yield GaugeMetricFamily(
        "tensor_server_remote_cache_max_bytes", "The remote byte cache's budget", value=stats["max_bytes"]
    )


#: the per-scan counts of ``Catalog.discovery_progress`` exported as one labelled gauge
_DISCOVERY_COUNTS = ("folders_walked", "files_seen", "files_unchanged", "files_opened", "files_failed", "pending_open")


def _discovery_families(progress: dict[str, Any], skipped: int) -> Iterator[Any]:
    """Discovery progress: the current (or last) scan's counts by kind (``skipped``: entries of
    the last finished scan refused without opening), and when the last full scan finished."""
    from prometheus_client.core import GaugeMetricFamily

    fam = GaugeMetricFamily(
        "tensor_server_discovery", "What the current (or last) discovery scan has done, by kind", labels=["kind"]
    )
    for kind in _DISCOVERY_COUNTS:
        fam.add_metric([kind], progress[kind])
    fam.add_metric(["skipped"], skipped)
    yield fam
    finished = progress["last_full_scan_finished_at"]
    if finished is not None:
        yield GaugeMetricFamily(
            "tensor_server_discovery_last_scan_finished_timestamp_seconds",
            "Unix time the last full scan finished",
            value=finished,
        )
