"""The live bench runs end to end on tiny frames: every frame a client reads has its own
pixels (the bench refuses a frame served before it was written), every latency is measured
from a write that returned before it, both clients end on the last frame, and the table has
a row per rate and client with its target (shapes and counts, not timings). A client that
falls behind reads the newest frame, not the backlog."""

from __future__ import annotations

import threading

import numpy as np

from tensor_server.bench.live import _read_newest, measure, rows_of, stamp


def test_a_tiny_acquisition_reaches_both_clients(tmp_path):
    results = measure(tmp_path, rates=[10.0, 100.0], seconds=0.5, side=64)
    assert [(r["rate"], r["frames"]) for r in results] == [(10.0, 5), (100.0, 50)]
    for result in results:
        assert sorted(result["noticed"]) == list(range(1, result["frames"] + 1)), "every growth announced"
        for who in ("sdk watch", "zarr poll", "noticed"):
            assert result["frames"] in result[who], f"{who} at {result['rate']} fps never had the last frame"
            if who == "sdk watch":  # read through the server, its pixels checked: after the write
                assert min(result[who].values()) > 0, f"{who}: a frame had before it was written"
            # the poller reads the files itself, and the server announces the extent the writer's
            # resize wrote: both can see a frame a little before the writer's write call returns
        assert all(result["noticed"][i] <= ms for i, ms in result["sdk watch"].items()), "read before announced"
    assert all(r["writer_alone_fps"] > 0 for r in results), "the writer's floor is measured"
    rows = rows_of(results)
    assert all("alone" in r["rate"] for r in rows)
    assert [(r["rate"].split(" (")[0], r["client"]) for r in rows] == [
        ("10 fps", "sdk watch"),
        ("10 fps", "zarr poll"),
        ("100 fps", "sdk watch"),
        ("100 fps", "zarr poll"),
    ]
    assert [r["frames"].split("/")[1] for r in rows] == ["5", "5", "50", "50"]
    assert rows[0]["target"] == "p50 <= 200, p99 <= 500" and rows[1]["target"] == "peer"
    assert all(r["p99_ms"] >= r["p50_ms"] > 0 for r in rows)


class _Frames:
    """A client whose every frame is written (``get_array`` answers frame i stamped i)."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def get_array(self, array_id, region):
        i = region[0].start
        self.asked.append(i)
        return stamp(np.zeros((1, 4, 4), np.uint16)[0], i)[None]


def test_a_client_behind_reads_the_newest_frame_not_the_backlog():
    client, arrived, newest = _Frames(), {}, threading.Condition()
    noticed = {i: 0.0 for i in range(1, 8)}  # frames 1..7 announced before the reader looked
    _read_newest(client, "a", 8, 4, noticed, arrived, newest)
    assert client.asked == [7] and list(arrived) == [7]
