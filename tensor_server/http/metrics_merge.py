"""``/metrics`` of a server of several processes (``serve --workers N``): the primary's door
answers for every process.

Each worker serves its own metrics door on a loopback port the primary learns when the worker
starts; at scrape time the primary reads them and answers one exposition in which every
sample carries a ``process`` label (``primary``, ``worker-1``, ...), so ``sum by (...)``
aggregates the server and a single process can still be told apart. prometheus_client's
multiprocess mode does not apply: the instruments here are collectors that read plain numbers
at scrape time (service/metrics.py), not its shared-memory values. A worker that does not
answer within ``SCRAPE_SECONDS`` (restarting) is left out of that scrape.
"""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["MergedRegistry", "SCRAPE_SECONDS"]

SCRAPE_SECONDS = 2.0


class MergedRegistry:
    """A registry for the metrics door: ``own``'s families and those scraped from each
    ``(label, port)`` of ``peers()``, merged by name with a ``process`` label on every sample.
    ``token``: the server token the workers' doors ask for; ``cafile``: the server's
    certificate when the doors speak TLS."""

    def __init__(
        self,
        own: Any,
        peers: Callable[[], list[tuple[str, int]]],
        *,
        token: str | None = None,
        cafile: str | None = None,
    ) -> None:
        self.own = own
        self._peers = peers
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._context = None
        if cafile is not None:
            self._context = ssl.create_default_context(cafile=cafile)
            self._context.check_hostname = False  # our own certificate, pinned, on loopback
        self._scheme = "https" if cafile is not None else "http"

    def collect(self) -> Iterator[Any]:
        from prometheus_client.metrics_core import Metric
        from prometheus_client.parser import text_string_to_metric_families

        merged: dict[str, Metric] = {}

        def add(process: str, families: Any) -> None:
            for family in families:
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation, family.type)
                into.samples += [s._replace(labels={**s.labels, "process": process}) for s in family.samples]

        add("primary", self.own.collect())
        for process, port in self._peers():
            text = self._scrape(port)
            if text is not None:
                add(process, text_string_to_metric_families(text))
        yield from merged.values()

    def _scrape(self, port: int) -> str | None:
        request = urllib.request.Request(f"{self._scheme}://127.0.0.1:{port}/metrics", headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=SCRAPE_SECONDS, context=self._context) as response:
                return response.read().decode()
        except (OSError, ValueError):
            return None
