"""What ``run`` and ``serve`` print on stdout once they serve: the snippets that read (and, for
``run``, upload) with the biopb SDK, then the block that says where to look (the catalog
page with its token, the OME-Zarr URL of a tensor, the Flight location, the metrics, where
requests are logged). The links come last, so they are what stays on screen; the request
log goes elsewhere for the same reason (issue 40: the way in was never printed, and what
was printed scrolled away under the request log).

Pure functions of the serving facts (``ServingFacts``): the command line gathers them, this
module only words them, and ``tests/cli_banner_test.py`` checks the wording without a server.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Example", "ServingFacts", "startup_text", "read_snippet", "upload_snippet", "BLOCK_TITLE", "BLOCK_END"]

#: the block's first and last lines (a test or a wrapper reads stdout up to ``BLOCK_END``)
BLOCK_TITLE = "-- tensor-server: where to look " + "-" * 38
BLOCK_END = "Ctrl-C stops the server."


@dataclass(frozen=True)
class Example:
    """A served tensor the ``run`` snippet reads at one of its advertised levels."""

    array_id: str
    scale: tuple[int, ...]
    method: str
    viewer_url: str | None = None  # its OME-Zarr URL (with the token), None without an HTTP door


@dataclass(frozen=True)
class ServingFacts:
    location: str  # the Flight location (grpc:// or grpc+tls://)
    catalog_url: str | None  # the catalog page with its token; None without an HTTP door
    metrics_url: str | None = None
    request_log: str | None = None  # the file requests are logged to; None: on stderr or off
    token: str | None = None  # the server's --token, which a client passes
    tls_fingerprint: str | None = None  # the certificate a client pins (--tls)
    list_command: str | None = None  # "<python> -m tensor_server list ROOT ...", said as a hint
    example: Example | None = None  # run: a tensor to read at a scaled level
    upload: bool = False  # run with a write dir: the upload snippet too


def _client_args(token: str | None, fingerprint: str | None) -> str:
    """The keyword arguments a printed snippet passes TensorFlightClient (token, pinned cert)."""
    return (f", token={token!r}" if token else "") + (f", tls_fingerprint={fingerprint!r}" if fingerprint else "")


def read_snippet(location: str, token: str | None, example: Example | None, fingerprint: str | None = None) -> str:
    """List the array ids, then read one: ``example`` at its scaled level, with the pyramid
    printed readably, or (no example: ``serve``) the first id whole. The id printed is this
    machine's (ids hash the path); the query is what finds them anywhere."""
    head = (
        "from biopb.tensor import TensorFlightClient\n"
        f"client = TensorFlightClient({location!r}{_client_args(token, fingerprint)})\n"
        'rows = client.query("SELECT unnest(tensors).array_id AS array_id FROM sources ORDER BY 1", format="records")\n'
        'print([r["array_id"] for r in rows])\n'
    )
    if example is None:
        return head + 'print(client.get_array(rows[0]["array_id"]).shape)'
    return head + (
        f"level = client.get_array({example.array_id!r}, scale_hint={list(example.scale)}, "
        f"reduction_method={example.method!r})\n"
        "print(level.shape, level.dtype)\n"
        f"for lv in client.get_descriptor({example.array_id!r}, with_pyramid=True).pyramid:\n"
        "    print(list(lv.scale_hint), lv.reduction_method, list(lv.shape))"
    )


def upload_snippet(location: str, token: str | None, fingerprint: str | None = None) -> str:
    """Upload a result to the scratch source, read it back, discard it."""
    return (
        "import uuid\n"
        "import numpy as np\n"
        "from biopb.tensor import TensorFlightClient\n"
        f"client = TensorFlightClient({location!r}{_client_args(token, fingerprint)})\n"
        "result = np.random.default_rng(0).integers(0, 4096, (512, 512), dtype=np.uint16)\n"
        "name = f'cache://scratch/@fields/result-{uuid.uuid4().hex[:8]}'\n"
        "desc = client.setup_array_upload(name, result, chunk_shape=(256, 256))\n"
        "print(client.upload_array(desc, result)['state'])  # READY\n"
        "assert (client.get_array(desc.array_id) == result).all()\n"
        "client.set_upload_status(desc.array_id, 'DISCARDED')  # or let scratch_ttl reclaim it"
    )


def startup_text(facts: ServingFacts) -> str:
    """The snippets, then the block of links, ending with ``BLOCK_END``."""
    f = facts
    what = "Read a scaled level" if f.example else "List and read the tensors"
    out = [
        f"{what} with the biopb SDK (pip install 'biopb[tensor]'):",
        "",
        read_snippet(f.location, f.token, f.example, f.tls_fingerprint),
        "",
    ]
    if f.upload:
        out += [
            "Upload a result (to the scratch source) and read it back:",
            "",
            upload_snippet(f.location, f.token, f.tls_fingerprint),
            "",
        ]
    rows = [
        ("catalog page", f.catalog_url, "open it in a browser"),
        ("OME-Zarr", f.example.viewer_url if f.example else None, "napari-ome-zarr, neuroglancer 'zarr://...', vizarr"),
        ("Flight", f.location, "the SDK snippet above"),
        ("metrics", f.metrics_url, "Prometheus"),
        ("request log", f.request_log, None),
        ("list", f.list_command, None),
    ]
    out.append(BLOCK_TITLE)
    out += [f"{name:<14}{value}" + (f"   ({why})" if why else "") for name, value, why in rows if value]
    out.append(BLOCK_END)
    return "\n".join(out)
