"""``python tools/layer_crossings.py``: which floors of the package one request walks through,
for a warm IIIF tile and a warm Flight ``DoGet``, traced in a real server.

The layering test (``tests/layering_test.py``) proves what modules *import*; a request can still
climb back up at run time, through an object a lower floor was handed (a provider implemented
in a door) or a callback. This traces every Python call while one request is served and prints,
per request:

* the calls between floors (caller floor -> callee floor, counted);
* the **climbs**: calls into a floor the caller's floor may not import (``FORBIDDEN`` of the
  layering test), with the functions named, so a callback can be told from a provider;
* how many times the read rules ran (``ServingRuntime.authorize``: the token or grant, the
  upload gate).

How the server threads are traced: the HTTP door's threads are Python threads and get the
profiler from ``threading.setprofile`` (set before the server starts); the Flight door's calls
arrive on gRPC's threads, so its ``do_get`` is wrapped to turn the profiler on for the call.
The numbers are call counts, not times: tracing makes everything slow.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.layering_test import FORBIDDEN  # the one list of floors and what each may import

_recording = threading.Event()
_edges: Counter[tuple[str, str]] = Counter()
_climbs: Counter[tuple[str, str]] = Counter()
_rules = Counter[str]()


def floor_of(module: str) -> str | None:
    """``tensor_server.render.plane`` -> ``render``; ``tensor_server_kernels.x`` -> ``kernels``."""
    if module.startswith("tensor_server_kernels"):
        return "kernels"
    parts = module.split(".")
    return parts[1] if parts[0] == "tensor_server" and len(parts) > 1 else None


def _caller(frame: Any) -> Any:
    """The nearest calling frame that is the package's own (library frames in between skipped)."""
    f = frame.f_back
    while f is not None and floor_of(f.f_globals.get("__name__", "")) is None:
        f = f.f_back
    return f


def _profile(frame: Any, event: str, arg: Any) -> None:
    if event != "call" or not _recording.is_set():
        return
    callee = floor_of(frame.f_globals.get("__name__", ""))
    if callee is None:
        return
    if frame.f_code.co_name == "authorize" and callee == "service":
        _rules["authorize"] += 1
    up = _caller(frame)
    if up is None:
        return
    caller = floor_of(up.f_globals["__name__"])
    assert caller is not None
    if caller == callee:
        return
    _edges[(caller, callee)] += 1
    if callee in FORBIDDEN.get(caller, ()):
        where = (
            f"{up.f_globals['__name__']}.{up.f_code.co_name} -> {frame.f_globals['__name__']}.{frame.f_code.co_name}"
        )
        _climbs[(f"{caller} -> {callee}", where)] += 1


def _traced(fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sys.setprofile(_profile)
        try:
            return fn(*args, **kwargs)
        finally:
            sys.setprofile(None)

    return wrapper


def _report(name: str) -> None:
    print(f"\n## {name}")
    print(f"calls between floors: {sum(_edges.values())}")
    for (a, b), n in sorted(_edges.items()):
        print(f"  {a:>8} -> {b:<8} {n}")
    print(f"climbs (a call into a floor the caller may not import): {sum(_climbs.values())}")
    for (kind, where), n in sorted(_climbs.items()):
        print(f"  {kind}: {where} x{n}")
    print(f"read rules run (ServingRuntime.authorize): {_rules['authorize']}")


def _measure(name: str, request: Any) -> None:
    import time

    for _ in range(3):  # warm: the chunks cached (the precacher stores them when idle), settings measured
        request()
        time.sleep(0.5)
    _edges.clear(), _climbs.clear(), _rules.clear()
    _recording.set()
    try:
        request()
    finally:
        _recording.clear()
    _report(name)


def main() -> None:
    import urllib.request

    import numpy as np
    import tifffile

    from tensor_server.cache import CacheManager
    from tensor_server.catalog import Catalog
    from tensor_server.flight import server as flight_server
    from tensor_server.testing.servers import serving

    door = flight_server.TensorFlightServer
    for verb in ("do_get", "do_action", "get_flight_info"):
        setattr(door, verb, _traced(getattr(door, verb)))
    threading.setprofile(_profile)
    with tempfile.TemporaryDirectory() as tmp:
        image = np.random.default_rng(0).integers(0, 4000, (2048, 2048), np.uint16)
        tifffile.imwrite(Path(tmp) / "image.tif", image, tile=(256, 256))
        catalog = Catalog([tmp])
        catalog.scan()
        cache = CacheManager(Path(tmp) / "cache")
        with serving(catalog, cache=cache, http=True) as served:
            array_id = next(iter(r.source_id for r in catalog.records()))
            tile = f"{served.http_url}/iiif/3/{array_id}/512,512,512,512/512,/0/default.jpg"
            _measure("IIIF tile (512x512 of level 0, warm)", lambda: urllib.request.urlopen(tile).read())
            _measure("Flight DoGet of one chunk, warm", _one_chunk(served, array_id))
        cache.close()


def _one_chunk(served: Any, array_id: str) -> Any:
    """A DoGet of the first chunk of the tensor's plan, as the SDK sends it to a remote server
    (on loopback the SDK maps the cache segment instead, through the ``chunk_locate`` action)."""
    from biopb.tensor import ticket_pb2
    from pyarrow import flight

    from tensor_server.service import Caller

    plan = served.runtime.describe(Caller(), array_id, fields=["endpoints"]).plan
    ticket = flight.Ticket(ticket_pb2.TensorTicket(chunk_id=plan.chunks[0].chunk_id.encode()).SerializeToString())
    client = flight.FlightClient(served.location)
    return lambda: client.do_get(ticket).read_all()


if __name__ == "__main__":
    main()
