"""Rendering of served tensors to 8-bit images, and the tiled viewer protocols built on it.

Transport-free and read-free (core, numpy and Pillow only): ``render.plane`` picks a 2-D plane
of an N-D tensor and the region of the level that serves a requested size (the service reads
it); ``render.colour``
turns raw pixels into 8-bit RGB (the ``omero`` block, else a percentile window; channel
colours; label colours); ``render.image`` renders regions and writes JPEG/PNG/WebP; ``render.iiif`` and
``render.deepzoom`` are the IIIF Image API 3 and DeepZoom request grammars, whose numbers
``render.numbers`` parses with bounds (ASCII digits, at most 9). The HTTP doors
(``http/iiif.py``, ``http/deepzoom.py``, ``http/catalog_page.py``) only translate, through
the viewer verbs of the service (``service/viewer_verbs.py``), which read the pixels and
hand them to ``render.image``.
"""
