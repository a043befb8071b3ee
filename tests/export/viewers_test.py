"""The viewers users open an export with show the right pixels: napari's OME-Zarr reader
plugin (``napari_ome_zarr``, no Qt needed) gets every level and the label image, equal to the
source; neuroglancer (headless Chromium) draws the sharded NGFF 0.5 output served by a plain
static HTTP server (byte ranges, as any web server or bucket serves it), dark where the
source is dark and bright where it is bright, in the right order."""

from __future__ import annotations

import io
import os
import re
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter
from tensor_server.core.engine import ReadEngine
from tensor_server.export import ExportOptions, export_tensor
from tensor_server.export.sources import open_export_source
from tests.export.helpers import write_cells
from tests.http.neuroglancer_test import screenshot_after_chunks

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_napari_ome_zarr_reads_every_level_and_the_labels(tmp_path):
    from napari_ome_zarr import napari_get_reader

    src_path = tmp_path / "cells.ome.zarr"
    write_cells(src_path)
    dest = tmp_path / "out.zarr"
    with open_export_source(str(src_path)) as src:
        export_tensor(
            src.tensor, dest, ExportOptions(levels=3, chunks=(1, 64, 64), shards=(1, 128, 128)), labels=src.labels
        )
        engine = ReadEngine()
        want_image = [engine.read(src.tensor, None, (1, 2**k, 2**k), "area") for k in range(3)]
        want_labels = [engine.read(src.labels["cells"], None, (2**k, 2**k), "mode") for k in range(3)]
    reader = napari_get_reader(str(dest))
    assert reader is not None, "napari-ome-zarr did not claim the export"
    layers = {kind: (data, kw) for data, kw, kind in reader(str(dest))}
    assert set(layers) == {"image", "labels"}
    image, image_kw = layers["image"]
    assert image_kw["channel_axis"] == 0 and image_kw["scale"] == pytest.approx([0.65, 0.65])
    assert len(image_kw["contrast_limits"]) == 2
    for k, (level, want) in enumerate(zip(image, want_image)):
        np.testing.assert_array_equal(np.asarray(level), want, err_msg=f"image level {k}")
    label_levels, _ = layers["labels"]
    for k, (level, want) in enumerate(zip(label_levels, want_labels)):
        np.testing.assert_array_equal(np.asarray(level), want, err_msg=f"label level {k}")
    assert len(np.unique(np.asarray(label_levels[0]))) > 2  # the cells, not just background


class _RangeHandler(SimpleHTTPRequestHandler):
    """A static file server as a web server or bucket is: CORS open, single byte ranges
    (neuroglancer reads a shard's index and inner chunks by range), shard GETs counted."""

    counts: dict[str, int]

    def end_headers(self) -> None:
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Access-Control-Expose-Headers", "Content-Range, Content-Length")
        self.send_header("Accept-Ranges", "bytes")
        super().end_headers()

    def do_OPTIONS(self) -> None:  # the http.server spelling
        self.send_response(204)
        self.send_header("Access-Control-Allow-Headers", "Range")
        self.end_headers()

    def do_GET(self) -> None:
        path = self.translate_path(self.path)
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        if not match or not os.path.isfile(path):
            return super().do_GET()
        size = os.path.getsize(path)
        a, b = match.groups()
        start, stop = (size - int(b), size) if not a else (int(a), min(size, int(b) + 1) if b else size)
        with open(path, "rb") as f:
            f.seek(start)
            body = f.read(max(0, stop - start))
        if "/c/" in self.path:
            self.counts["ranges"] += 1
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:  # quiet
        pass


def test_neuroglancer_draws_the_sharded_export_from_a_static_server(tmp_path):
    import neuroglancer
    from PIL import Image

    halves = np.full((512, 512), 2000, np.uint16)
    halves[:, 256:] = 60000
    tensor = ArrayAdapter(halves, "yx", physical_scale=(1.0, 1.0), physical_unit=("micrometer", "micrometer"))
    tensor.array_id = "halves"
    export_tensor(tensor, tmp_path / "halves.zarr", ExportOptions(levels=2, chunks=(64, 64), shards=(256, 256)))
    counts = {"ranges": 0}
    handler = type("Handler", (_RangeHandler,), {"counts": counts})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        neuroglancer.set_server_bind_address("127.0.0.1")
        viewer = neuroglancer.Viewer()
        with viewer.txn() as state:
            state.layers["halves"] = neuroglancer.ImageLayer(
                source=f"zarr3://http://127.0.0.1:{server.server_address[1]}/halves.zarr/",
                shader="void main() { emitGrayscale(float(getDataValue().value) / 65535.0); }",
            )
            state.layout = "xy"
        png = screenshot_after_chunks(viewer, served=lambda: counts["ranges"])
        (tmp_path / "neuroglancer-export.png").write_bytes(png)
    finally:
        server.shutdown()
        server.server_close()
    assert counts["ranges"] >= 4, "neuroglancer read no shard ranges"
    shot = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float64)
    h, w = shot.shape
    rows = shot[:, w // 3 : 2 * w // 3].mean(axis=1)  # the middle third, inside the image area
    dark, bright = rows < 40, rows > 200
    assert dark.sum() > h * 0.1 and bright.sum() > h * 0.1, f"dark {dark.sum()}, bright {bright.sum()} of {h} rows"
    # the xy panel shows (y, x) across and down: x < 256 (dark) above x >= 256 (bright)
    assert np.flatnonzero(dark).mean() < np.flatnonzero(bright).mean(), "the halves are in the wrong order"
    assert 0.5 < bright.sum() / dark.sum() < 2.0, "the halves rendered unequally"
