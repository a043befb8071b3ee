"""MergedRegistry (http/metrics_merge.py): the primary's families and each worker's scrape,
one family per name, every sample labelled with its process; a worker that does not answer
is left out of the scrape, never an error."""

from __future__ import annotations

import socket

from prometheus_client import CollectorRegistry, Counter, generate_latest, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from tensor_server.http.metrics_merge import MergedRegistry


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_process_is_one_label_of_one_family():
    own, peer = CollectorRegistry(), CollectorRegistry()
    Counter("served", "chunks served", registry=own).inc(2)
    Counter("served", "chunks served", registry=peer).inc(5)
    port, silent = _free_port(), _free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=peer)
    try:
        merged = MergedRegistry(own, lambda: [("worker-1", port), ("worker-2", silent)])
        (family,) = [f for f in text_string_to_metric_families(generate_latest(merged).decode()) if f.name == "served"]
    finally:
        server.shutdown()
        thread.join()
    totals = {s.labels["process"]: s.value for s in family.samples if s.name == "served_total"}
    assert totals == {"primary": 2.0, "worker-1": 5.0}
