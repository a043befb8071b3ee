"""The publication conformance suite (``testing/door_tests.py`` ``PublicationTests``): the
OME-Zarr view, IIIF, DeepZoom and the export of one image with a label image publish equal
NGFF documents and the same levels."""

from __future__ import annotations

from tensor_server.testing.door_tests import PublicationTests


class TestPublication(PublicationTests):
    pass
