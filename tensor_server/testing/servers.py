"""In-process servers for tests, benchmarks and asv: one helper instead of a copy in each.

``serving(catalog, ...)`` (or ``start_serving``) builds the serving runtime from ``Settings`` fields, starts the
Flight door (and, with ``http=True``, the HTTP door) on 127.0.0.1 ephemeral ports, and
stops and joins them on exit, so a test never leaks a listening thread into the next.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tensor_server.config import Settings

__all__ = ["Served", "serving", "start_serving"]


@dataclass
class Served:
    """A running runtime and its doors (``http`` is None unless asked for)."""

    runtime: Any  # tensor_server.service.ServingRuntime
    flight: Any  # tensor_server.flight.TensorFlightServer
    http: Any | None = None
    thread: threading.Thread | None = None
    #: the metrics door (``metrics_port=0`` starts one on a free port)
    metrics: Any | None = None

    @property
    def location(self) -> str:
        return self.flight.location

    @property
    def http_url(self) -> str:
        if self.http is None:
            raise RuntimeError("started without http=True")
        return self.http.url

    @property
    def metrics_url(self) -> str:
        if self.metrics is None:
            raise RuntimeError("started without metrics_port=0")
        return self.metrics.url

    def client(self, token: str | None = None):  # biopb.tensor.TensorFlightClient
        from biopb.tensor import TensorFlightClient

        return TensorFlightClient(self.location, token=token)

    def stop(self) -> None:
        """Stop the doors and join the Flight thread, then close what the runtime started.
        The watch streams end first: a door's stop waits for its calls, and a watch lasts
        until its client goes."""
        self.runtime.watches.close()
        if self.metrics is not None:
            self.metrics.stop()
        if self.http is not None:
            self.http.stop()
        self.flight.shutdown()
        if self.thread is not None:
            self.thread.join(timeout=10)
        self.runtime.close()
        if self.thread is not None and self.thread.is_alive():
            raise RuntimeError("the Flight door's thread did not stop")


def start_serving(
    catalog: Any,
    *,
    cache: Any | None = None,
    uploads: Any | None = None,
    http: bool = False,
    http_security: Any | None = None,
    http_parser: str | None = None,
    tls: Any | None = None,
    access_tokens: Any = (),
    host: str = "127.0.0.1",
    port: int = 0,
    **settings: Any,
) -> Served:
    """A runtime over ``catalog`` (``settings``: ``Settings`` fields, e.g. ``token``,
    ``write_dir``, ``writable``, ``max_computes``) behind a Flight door and optionally the
    HTTP door (``http_security``: its browser-safety policy, default loopback Hosts and the
    server token if any; its tokens become full-access credentials of the runtime, as in
    ``serve``; ``http_parser``: ``HttpFrontEnd``'s parser); ``tls``: a ``service.tls.ServerTls`` both doors serve. ``Served.stop()``
    ends it (benchmarks with set-up and tear-down use this, tests use ``serving``)."""
    from tensor_server.flight import TensorFlightServer
    from tensor_server.service import ServingRuntime

    door_tokens = http_security.tokens if http_security is not None else ()  # full access, as in serve
    runtime = ServingRuntime(
        catalog,
        Settings(**settings),
        cache=cache,
        uploads=uploads,
        tls=tls,
        access_tokens=(*access_tokens, *door_tokens),
    )
    try:
        server = TensorFlightServer(runtime, host, port)
    except BaseException:
        runtime.close()
        raise
    thread = threading.Thread(target=server.serve, name="test-flight-door", daemon=True)
    thread.start()
    served = Served(runtime, server, None, thread)
    if http:
        from tensor_server.http.app import HttpFrontEnd, build_app

        try:
            served.http = HttpFrontEnd(build_app(runtime, http_security), host, 0, tls=tls, parser=http_parser)
            served.http.start()
            runtime.http_listening(served.http.scheme, host, served.http.port)
        except BaseException:
            served.http = None
            served.stop()
            raise
    if runtime.settings.metrics_port is not None:
        from tensor_server.http.metrics_door import MetricsDoor

        try:
            served.metrics = MetricsDoor(runtime, host)
        except BaseException:
            served.stop()
            raise
    return served


@contextmanager
def serving(catalog: Any, **options: Any) -> Iterator[Served]:
    """``start_serving(catalog, **options)``, stopped on exit."""
    served = start_serving(catalog, **options)
    try:
        yield served
    finally:
        served.stop()
