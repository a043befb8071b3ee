"""OIDC sign-in tokens (issue 45): a JWT from the lab's identity provider, verified against its
JWKS, is a user of the server on every door; a token signed by another key, with ``alg: none``,
expired, for another audience or without a ``sub`` is refused saying why; the user's ``sub``
(not the token, which is refreshed) writes its annotations. Keys are made here."""

from __future__ import annotations

import base64
import json
import time

import httpx
import numpy as np
import pyarrow.flight as flight
import pytest
from joserfc import jwt
from joserfc.jwk import OctKey, RSAKey

from tensor_server.adapters.memory import ArrayAdapter, MemorySource
from tensor_server.catalog import Catalog
from tensor_server.testing import serving

ISSUER, AUDIENCE, TOKEN = "https://login.lab.example/realms/lab", "tensor-server", "server-token-for-oidc"
IMAGE = np.arange(16 * 12, dtype=np.uint16).reshape(16, 12)
KEY = RSAKey.generate_key(2048, parameters={"kid": "lab-1"}, private=True)


def _token(key=KEY, alg="RS256", **overrides) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "iat": now, "nbf": now - 5, "exp": now + 600}
    claims.update(overrides)
    claims = {k: v for k, v in claims.items() if v is not None}
    return jwt.encode({"alg": alg, "kid": "lab-1"}, claims, key)


def _unsigned(**claims) -> str:
    part = lambda value: base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()  # noqa: E731
    now = int(time.time())
    return f"{part({'alg': 'none'})}.{part({'iss': ISSUER, 'aud': AUDIENCE, 'sub': 'eve', 'exp': now + 600})}."


@pytest.fixture
def served(tmp_path):
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [KEY.as_dict(private=False)]}))
    cat = Catalog([], rois_path=str(tmp_path / "rois.duckdb"))
    cat.add_source(MemorySource(ArrayAdapter(IMAGE, "yx", chunk_shape=IMAGE.shape), source_id="img"))
    cat.first_scan_done.set()
    with serving(
        cat, http=True, token=TOKEN, oidc_issuer=ISSUER, oidc_audience=AUDIENCE, oidc_jwks_file=str(jwks)
    ) as srv:
        yield srv
    cat.close()


def _http(srv, token):
    return httpx.get(f"{srv.http_url}/zarr/img/.zattrs", headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_a_valid_sign_in_token_reads_on_every_door(served):
    token = _token()
    np.testing.assert_array_equal(served.client(token).get_array("img"), IMAGE)
    assert _http(served, token).status_code == 200
    assert httpx.get(f"{served.http_url}/iiif/3/img/info.json", headers={"Authorization": f"Bearer {token}"},
                     timeout=30).status_code == 200  # fmt: skip


@pytest.mark.parametrize(
    "make, says",
    [
        (
            lambda: _token(key=RSAKey.generate_key(2048, parameters={"kid": "lab-1"}, private=True)),
            "signed by another key",
        ),
        (lambda: _unsigned(), "not allowed"),  # alg: none
        (lambda: _token(key=OctKey.import_key(b"k" * 32), alg="HS256"), "not allowed"),  # a symmetric alg
        (lambda: _token(exp=int(time.time()) - 3600), "has expired"),
        (lambda: _token(aud="another-service"), "'aud'"),
        (lambda: _token(sub=None), "'sub'"),
        (lambda: _token(nbf=int(time.time()) + 3600), "not yet valid"),
    ],
    ids=["another key", "alg none", "HS256", "expired", "another audience", "no sub", "not yet valid"],
)
def test_a_bad_sign_in_token_is_refused_saying_why(served, make, says):
    token = make()
    refused = _http(served, token)
    assert refused.status_code == 401 and says in refused.text, refused.text
    with pytest.raises(flight.FlightUnauthenticatedError, match=says):
        served.client(token).get_array("img")


def test_the_sub_writes_its_annotations_across_token_refreshes(served):
    from biopb.image.annotation_pb2 import RoiAnnotation
    from biopb.image.roi_pb2 import ROI

    def roi(x):
        r = ROI()
        r.point.x, r.point.y = x, 1
        return RoiAnnotation(roi_id="mine", roi=r)

    served.client(_token(sub="alice")).put_rois("img", [roi(1)])
    refreshed = _token(sub="alice", iat=int(time.time()) + 1)  # another token, the same user
    served.client(refreshed).put_rois("img", [roi(2)])
    with pytest.raises(flight.FlightUnauthorizedError, match="stored by another client"):
        served.client(_token(sub="bob")).put_rois("img", [roi(3)])
    (stored,) = served.client(TOKEN).list_rois("img").rois
    assert (stored.roi.point.x, stored.rev) == (2, 2)
