"""``ServingRuntime.fields(source, caller)``: the one answer to "which tensors does this source
serve to this caller", and every listing that takes its tensors from it (SQL rows, the catalog
page and ``/api/catalog``, the OME-Zarr ``labels/`` listing, export), through the real doors:
uploads made with the biopb SDK, read back over HTTP as zarr clients and scripts read them."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.core.bounds import Bounds
from tensor_server.core.chunk_id import ChunkId
from tensor_server.service import Caller
from tensor_server.service.access import grant_digest
from tensor_server.testing import serving

IMAGE = np.arange(40 * 30, dtype=np.uint16).reshape(40, 30)
NUCLEI = (IMAGE % 7).astype(np.uint32)
RESULT = (np.arange(24 * 20, dtype=np.float32) / 3).reshape(24, 20)
GRANT = "fields-grant"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    """A local-mode server (no token) with an image, a multi-tensor source, and, uploaded
    through the SDK: a READY result on the scratch source, a READY label set of the image, a
    PENDING result; and, granted to ``GRANT``, a READY result and a READY label set."""
    cat = Catalog([])
    cat.add_source(MemorySource(ArrayAdapter(IMAGE, "yx", chunk_shape=(16, 16)), source_id="img"))
    cat.add_source(
        MemorySource({"a": ArrayAdapter(IMAGE[:8], "yx"), "b": ArrayAdapter(IMAGE[:4], "yx")}, source_id="pair")
    )
    cat.first_scan_done.set()
    with serving(cat, http=True, write_dir=str(tmp_path_factory.mktemp("write")), writable=True) as served:
        client = served.client()
        desc = client.setup_array_upload("zarr://scratch/@fields/result", RESULT, chunk_shape=(16, 16))
        client.upload_array(desc, RESULT)
        labels = client.setup_array_upload("zarr://img/@labels/nuclei", NUCLEI, chunk_shape=(40, 30))
        client.upload_array(labels, NUCLEI)
        client.setup_array_upload("zarr://scratch/@fields/pending", RESULT, chunk_shape=(24, 20))
        for request_id, data in (("cache://scratch/@fields/granted", RESULT), ("zarr://img/@labels/secret", NUCLEI)):
            _granted_upload(served.runtime.uploads, request_id, data)
        yield served
    cat.close()


def _granted_upload(manager, request_id, data):
    """A READY upload granted to ``GRANT`` (as an in-process producer asking for a private one makes it)."""
    up = manager.add_tensor(
        request_id, data.shape, data.dtype, chunk_shape=data.shape, owner=grant_digest(GRANT), grant=grant_digest(GRANT)
    )
    cid = ChunkId.for_extent(up.array_id, Bounds((0, 0), data.shape), (1, 1), "none", up.tensor.content_version)
    manager.write_chunk(cid, data)
    manager.set_ready(up.array_id)


def listed(served, source_id, token=None):
    return [t.listed_id for t in served.runtime.fields(source_id, Caller(token=token)).values()]


def test_fields_list_own_tensors_then_ready_uploads_for_the_caller(srv):
    assert listed(srv, "img") == ["img", "img/@labels/nuclei"]  # beside label sets only: the bare id
    assert listed(srv, "pair") == ["pair/a", "pair/b"]
    assert listed(srv, "scratch") == ["scratch/@fields/result"]  # not PENDING, not another's grant
    assert listed(srv, "scratch", GRANT) == ["scratch/@fields/result", "scratch/@fields/granted"]
    assert listed(srv, "img", GRANT) == ["img", "img/@labels/nuclei", "img/@labels/secret"]
    fields = srv.runtime.fields("img", Caller())  # by field: the image's own, then the label set's
    own, label_set = fields.values()
    assert own.tensor.array_id == "img" and list(fields)[1] == "@labels/nuclei" and label_set.tensor.is_labels


def test_sql_rows_are_the_fields_for_the_same_caller(srv):
    for token in (None, GRANT):
        rows = srv.client(token).query("SELECT source_id, tensors FROM sources", format="records")
        by_source = {r["source_id"]: [t["array_id"] for t in r["tensors"]] for r in rows}
        for source_id in ("img", "pair", "scratch"):
            assert by_source[source_id] == listed(srv, source_id, token), (source_id, token)


def test_an_unknown_source_is_not_found(srv):
    from tensor_server.errors import TensorNotFound

    with pytest.raises(TensorNotFound):
        srv.runtime.fields("nope", Caller())


def _zarr_array(url):
    import zarr

    return zarr.open_array(url, mode="r")[...]


@pytest.mark.parametrize("flavour", ["zarr", "zarr3"])
def test_a_ready_upload_on_scratch_reads_at_its_ome_zarr_urls(srv, flavour):
    """The scratch source holds no default tensor; its fields are found anyway (it was a 404)."""
    url = f"{srv.http_url}/{flavour}/scratch/@fields/result/"
    key = "0/.zarray" if flavour == "zarr" else "0/zarr.json"
    assert httpx.get(url + key).json()["shape"] == list(RESULT.shape)
    np.testing.assert_array_equal(_zarr_array(url + "0"), RESULT)
    missing = httpx.get(f"{srv.http_url}/{flavour}/scratch/@fields/nothing/0/{key[2:]}")
    assert missing.status_code == 404 and "@fields/nothing" in missing.text
    assert httpx.get(f"{srv.http_url}/{flavour}/scratch/").status_code == 404  # no tensor of its own


@pytest.mark.parametrize("flavour", ["zarr", "zarr3"])
def test_an_uploaded_label_set_is_in_its_images_labels_group(srv, flavour):
    base = f"{srv.http_url}/{flavour}/img/"
    attrs = httpx.get(base + ("labels/.zattrs" if flavour == "zarr" else "labels/zarr.json")).json()
    names = attrs["labels"] if flavour == "zarr" else attrs["attributes"]["ome"]["labels"]
    assert names == ["nuclei"]
    assert httpx.get(base).json()["labels"] == ["nuclei"]
    np.testing.assert_array_equal(_zarr_array(base + "labels/nuclei/0"), NUCLEI)


def test_the_page_and_the_json_catalog_list_the_scratch_uploads(srv):
    page = httpx.get(f"{srv.http_url}/").text
    assert "scratch/@fields/result" in page and "scratch/@fields/pending" not in page
    assert "scratch/@fields/granted" not in page  # another's grant
    assert "scratch/@fields/result" in httpx.get(f"{srv.http_url}/?folder=scratch").text  # was "Nothing is served"
    doc = httpx.get(f"{srv.http_url}/api/catalog").json()
    scratch = next(s for s in doc["sources"] if s["source_id"] == "scratch")
    assert [t["array_id"] for t in scratch["tensors"]] == ["scratch/@fields/result"]
    assert scratch["tensors"][0]["shape"] == list(RESULT.shape) and scratch["tensors"][0]["dtype"] == "<f4"


def test_a_granted_label_set_is_listed_to_its_holder_alone(srv):
    for token, want in ((None, ["nuclei"]), ("wrong", ["nuclei"]), (GRANT, ["nuclei", "secret"])):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        assert httpx.get(f"{srv.http_url}/zarr/img/labels/.zattrs", headers=headers).json()["labels"] == want
        assert httpx.get(f"{srv.http_url}/zarr/img/", headers=headers).json()["labels"] == want
    refused = httpx.get(f"{srv.http_url}/zarr/img/labels/secret/0/.zarray")
    assert refused.status_code == 404 and "no label image 'secret'" in refused.text  # nothing of its shape


def test_export_takes_the_uploaded_label_set(srv):
    image = srv.runtime.tensor("img", Caller())[0]
    labels = srv.runtime.image_labels(Caller(), image)  # what export_verb writes under labels/
    assert list(labels) == ["nuclei"]
    np.testing.assert_array_equal(labels["nuclei"].get_data(), NUCLEI)
