"""The HTTP front end: served tensors as virtual OME-Zarr images (see ``app.py``)."""
