"""tensor_stats (core, Flight action, CLI) in closed form over uniform blocks, and special
chunks through the real biopb client."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tensor_server.core.bounds import Bounds
from tensor_server.core.engine import ReadEngine
from tensor_server.core.stats import tensor_stats

from .conftest import ReadCounter


def sparse_zarr(path, dtype="u2", fill=0):
    import zarr

    z = zarr.create_array(str(path), shape=(8, 256, 256), chunks=(4, 64, 128), dtype=dtype, fill_value=fill)
    a = np.full((8, 256, 256), fill, dtype=dtype)
    a[4:8, 64:128, 128:256] = (np.arange(4 * 64 * 128) % 1000).reshape(4, 64, 128).astype(dtype)
    z[4:8, 64:128, 128:256] = a[4:8, 64:128, 128:256]
    return a


def numpy_stats(a: np.ndarray) -> dict:
    return {
        "count": a.size,
        "count_nonzero": int(np.count_nonzero(a)),
        "min": a.min().item(),
        "max": a.max().item(),
        "sum": a.astype(np.float64).sum().item() if a.dtype.kind == "f" else int(a.sum(dtype=np.int64)),
    }


@pytest.mark.parametrize("dtype,fill", [("u2", 0), ("i4", -3), ("f4", 0.5)])
def test_stats_closed_form_equal_numpy(tmp_path, dtype, fill) -> None:
    from tensor_server.adapters.zarr import ZarrSource

    a = sparse_zarr(tmp_path / "s.zarr", dtype, fill)
    t = ZarrSource(tmp_path / "s.zarr").tensor()
    counted = ReadCounter(t)
    got = tensor_stats(t)
    want = numpy_stats(a)
    assert {k: got[k] for k in want} == pytest.approx(want)
    assert got["mean"] == pytest.approx(a.astype(np.float64).mean())
    assert got["decoded_pixels"] == 4 * 64 * 128 and counted.pixels == 4 * 64 * 128
    assert got["uniform_pixels"] == a.size - 4 * 64 * 128
    region = Bounds((0, 0, 0), (8, 100, 200))
    got = tensor_stats(t, region)
    want = numpy_stats(a[region.to_slices()])
    assert {k: got[k] for k in want} == pytest.approx(want)
    off = tensor_stats(t, None, ReadEngine(special_chunks=False))
    assert off["uniform_pixels"] == 0 and off["sum"] == pytest.approx(numpy_stats(a)["sum"])


def test_stats_nan_propagates(tmp_path) -> None:
    import zarr

    from tensor_server.adapters.zarr import ZarrSource

    zarr.create_array(str(tmp_path / "n.zarr"), shape=(64, 64), chunks=(32, 32), dtype="f4", fill_value=np.nan)
    got = tensor_stats(ZarrSource(tmp_path / "n.zarr").tensor())
    assert got["min"] == "nan" and got["sum"] == "nan" and got["count_nonzero"] == 64 * 64
    assert got["decoded_pixels"] == 0


def test_stats_cli(tmp_path, capsys) -> None:
    from tensor_server.cli import main

    a = sparse_zarr(tmp_path / "c.zarr")
    assert main(["stats", str(tmp_path / "c.zarr"), "--slice", "4:8,64:128"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[0])
    part = a[4:8, 64:128]
    assert line["max"] == int(part.max()) and line["sum"] == int(part.sum(dtype=np.int64))
    assert line["count"] == part.size
    assert main(["stats", str(tmp_path / "missing.zarr")]) == 2
    capsys.readouterr()
    assert main(["stats", str(tmp_path / "c.zarr"), "--slice", "1:0"]) == 2  # empty: refused, not [1, 1)
    assert "'1:0' is empty" in capsys.readouterr().err


def test_stats_cli_on_a_folder_reads_every_tensor_under_it(tmp_path, capsys) -> None:
    """A folder that is not one dataset: one line per tensor of every source under it (the help
    says "every tensor of a file or folder"), each naming its file; an unreadable file is said
    on stderr and makes the exit 1; a folder with nothing to read is 2."""
    import tifffile

    from tensor_server.cli import main

    (tmp_path / "sub").mkdir()
    a = np.arange(12, dtype=np.uint8).reshape(3, 4)
    b = np.full((2, 5), 7, dtype=np.uint16)
    tifffile.imwrite(tmp_path / "a.tif", a)
    tifffile.imwrite(tmp_path / "sub" / "b.tif", b)
    (tmp_path / "notes.txt").write_text("not an image")
    assert main(["stats", str(tmp_path)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["path"], line["dtype"], line["sum"], line["min"], line["max"]) for line in lines] == [
        (str(tmp_path / "a.tif"), "|u1", 66, 0, 11),
        (str(tmp_path / "sub" / "b.tif"), "<u2", 70, 7, 7),
    ]
    assert main(["stats", str(tmp_path), "--slice", "0:2,1:3"]) == 0
    assert [json.loads(line)["sum"] for line in capsys.readouterr().out.splitlines()] == [
        int(a[0:2, 1:3].sum()),
        int(b[0:2, 1:3].sum()),
    ]
    (tmp_path / "broken.tif").write_bytes(b"not a tiff")
    assert main(["stats", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 2 and f"stats: {tmp_path / 'broken.tif'}: unreadable: " in err
    (tmp_path / "empty").mkdir()
    assert main(["stats", str(tmp_path / "empty")]) == 2
    assert f"stats: no tensor under {tmp_path / 'empty'}" in capsys.readouterr().err


def test_special_chunks_over_flight(tmp_path) -> None:
    import pyarrow.flight as flight
    from tensor_server_kernels.reference import downsample

    from tensor_server.catalog import Catalog
    from tensor_server.testing import serving

    from ..flight.conftest import client_for

    a = sparse_zarr(tmp_path / "w.zarr")
    cat = Catalog([tmp_path])
    cat.scan()
    try:
        with serving(cat) as server:
            (rec,) = list(cat.records())
            t = rec.source.tensor()
            counted = ReadCounter(t)
            client = client_for(server)
            got = np.asarray(client.get_array(t.array_id, scale_hint=[1, 4, 4], reduction_method="area"))
            assert np.array_equal(got, downsample(a, (1, 4, 4), "area"))
            full = np.asarray(client.get_array(t.array_id))
            assert np.array_equal(full, a)
            assert counted.pixels == 2 * 4 * 64 * 128  # the dense block, once per read
            raw = flight.FlightClient(server.location)
            body = json.dumps({"array_id": t.array_id, "slice": {"start": [0, 0, 0], "stop": [8, 128, 256]}}).encode()
            (res,) = list(raw.do_action(flight.Action("tensor_stats", body)))
            stats = json.loads(res.body.to_pybytes())
            part = a[:, :128]
            assert stats["sum"] == int(part.sum(dtype=np.int64)) and stats["max"] == int(part.max())
            with pytest.raises(flight.FlightServerError, match="not JSON"):
                list(raw.do_action(flight.Action("tensor_stats", b"{")))
            with pytest.raises(flight.FlightError, match="nope"):
                list(raw.do_action(flight.Action("tensor_stats", b'{"array_id": "nope"}')))
            raw.close()
    finally:
        cat.close()


def test_config_switch(tmp_path) -> None:
    from tensor_server.config import load_settings

    cfg = tmp_path / "c.toml"
    cfg.write_text("[read]\nspecial_chunks = false\n")
    assert load_settings(cfg).special_chunks is False
    assert load_settings().special_chunks is True
