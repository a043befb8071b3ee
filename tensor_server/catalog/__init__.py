"""Discovery of sources under served roots, and the SQL catalog of them (DuckDB)."""

from __future__ import annotations

from tensor_server.catalog.catalog import Catalog, SourceRecord
from tensor_server.catalog.discovery import Claim, discover

__all__ = ["Catalog", "SourceRecord", "Claim", "discover"]
