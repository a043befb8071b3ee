"""Benchmark scripts (``python -m tensor_server.bench --help``); not part of the server."""
