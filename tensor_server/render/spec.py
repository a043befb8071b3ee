"""Render specs: which channels of a tensor to show and how, as a JSON document stored once
(``POST /render``) and named by a short id in image URLs (``<array_id>;r=<id>``), so a URL
stays short however many channels the spec names.

The document::

    {"channels": [{"index": 3, "color": "#FF8000", "window": {"start": 100, "end": 4000},
                   "gamma": 0.8, "invert": false, "visible": true},
                  {"index": 17, "color": "viridis", "window": {"percentiles": [0.1, 99.9]}}],
     "plane": {"z": 12, "t": 0},
     "labels": {"name": "cells", "opacity": 0.5, "colors": {"7": "#FF0000"}}}

Only ``index`` is required. ``color``: ``#RRGGBB`` or a name (``render.luts``); unset, the
channel's own colour (its ``omero`` colour, else the default table). ``window``: ``start`` and
``end`` in the data's units, or ``percentiles`` of its coarsest level (``render.histogram``);
unset, the channel's default window. ``gamma`` in (0, 10], default 1. Channels not named are
not shown; the named ones are added in the order given (``tensor_server_kernels.composite``),
at most ``MAX_VISIBLE`` visible. ``plane``: the indices of other axes, which an identifier's
own ``;z=`` overrides (a viewer's z slider keeps the spec). ``labels``: a label image of the
tensor's source (by the name its OME-Zarr view lists under ``labels/``), drawn over the
composite at ``opacity`` (0 to 1, default 0.5), each label value in its own stable colour
unless ``colors`` gives it one (``#RRGGBB`` or a tint name, keyed by the value in decimal;
``tensor_server_kernels.overlay``); a name the source does not have is named when the spec
is used (``service/viewer_verbs.py``).

Why checked here, below the doors: the rules are the same on every door, and each refusal is
an ``InvalidArgument`` (400) naming the field (``channels[2].window.start``); a channel the
tensor does not have is named when the spec is used with that tensor (``resolve``).

The id is the first ``ID_CHARS`` hex digits of the SHA-256 of the spec's canonical JSON (the
same document, in any key order or spacing, is the same id). ``SpecStore`` keeps at most
``MAX_STORED_SPECS`` specs and ``MAX_STORED_BYTES`` of them, oldest used first out; an id it
evicted answers 404 saying to post the spec again, an id it never held a 400.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tensor_server_kernels.composite import MAX_CHANNELS, Channel

from tensor_server.errors import InvalidArgument, RenderSpecEvicted
from tensor_server.render.luts import LUT_NAMES, colour_value, normalised_colour
from tensor_server.render.plane import MAX_IDENTIFIER

__all__ = [
    "ChannelSpec",
    "LabelSpec",
    "RenderSpec",
    "SpecStore",
    "parse_spec",
    "split_spec_id",
    "resolve",
    "MAX_SPEC_BYTES",
    "MAX_SPEC_CHANNELS",
    "MAX_VISIBLE",
    "MAX_STORED_SPECS",
    "MAX_STORED_BYTES",
    "ID_CHARS",
]

MAX_SPEC_BYTES = 256 * 1024
MAX_SPEC_CHANNELS = 1024
MAX_VISIBLE = MAX_CHANNELS
MAX_GAMMA = 10.0
MAX_STORED_SPECS = 4096
MAX_STORED_BYTES = 32 * 1024 * 1024
ID_CHARS = 16
#: ids of evicted specs remembered, so they answer 404 (post again) rather than 400
_EVICTED_REMEMBERED = 65536
_MAX_INDEX = 999_999_999
_CHANNEL_KEYS = frozenset({"index", "visible", "color", "window", "gamma", "invert"})
_LABEL_KEYS = frozenset({"name", "opacity", "colors"})
MAX_LABEL_COLOURS = 4096
_ID_RANGE = (-(2**63), 2**64 - 1)


@dataclass(frozen=True)
class ChannelSpec:
    index: int
    visible: bool = True
    color: str | None = None
    start: float | None = None
    end: float | None = None
    percentiles: tuple[float, float] | None = None
    gamma: float = 1.0
    invert: bool = False

    def as_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"index": self.index, "visible": self.visible, "gamma": self.gamma, "invert": self.invert}
        if self.color is not None:
            doc["color"] = self.color
        if self.start is not None:
            doc["window"] = {"start": self.start, "end": self.end}
        elif self.percentiles is not None:
            doc["window"] = {"percentiles": list(self.percentiles)}
        return doc


@dataclass(frozen=True)
class LabelSpec:
    """A label image drawn over the composite: its name, opacity and per-value colours
    (``#RRGGBB`` or a tint name, by label value)."""

    name: str
    opacity: float = 0.5
    colors: tuple[tuple[int, str], ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "opacity": self.opacity, "colors": {str(k): v for k, v in self.colors}}


@dataclass(frozen=True)
class RenderSpec:
    channels: tuple[ChannelSpec, ...]
    plane: tuple[tuple[str, int], ...] = ()
    labels: LabelSpec | None = None

    def canonical(self) -> bytes:
        doc: dict[str, Any] = {"channels": [c.as_json() for c in self.channels], "plane": dict(self.plane)}
        if self.labels is not None:  # absent, the document (and id) of a spec without labels
            doc["labels"] = self.labels.as_json()
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @property
    def id(self) -> str:
        return hashlib.sha256(self.canonical()).hexdigest()[:ID_CHARS]


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgument(f"{field}: {str(value)[:40]!r} is not a finite number")
    return float(value)


def _flag(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{field}: {str(value)[:40]!r} is not true or false")
    return value


def _index(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_INDEX:
        raise InvalidArgument(f"{field}: {str(value)[:40]!r} is not a whole number from 0 to {_MAX_INDEX}")
    return value


def _window(doc: Any, field: str) -> tuple[float | None, float | None, tuple[float, float] | None]:
    if not isinstance(doc, dict) or set(doc) not in ({"start", "end"}, {"percentiles"}):
        raise InvalidArgument(f'{field}: give {{"start": s, "end": e}} or {{"percentiles": [low, high]}}')
    if "percentiles" in doc:
        pair = doc["percentiles"]
        if not isinstance(pair, list) or len(pair) != 2:
            raise InvalidArgument(f"{field}.percentiles: give two numbers [low, high]")
        low, high = (_number(v, f"{field}.percentiles[{k}]") for k, v in enumerate(pair))
        if not 0 <= low < high <= 100:
            raise InvalidArgument(f"{field}.percentiles: [{low}, {high}] must have 0 <= low < high <= 100")
        return None, None, (low, high)
    start, end = _number(doc["start"], f"{field}.start"), _number(doc["end"], f"{field}.end")
    if not start < end:
        raise InvalidArgument(f"{field}: start {start} must be below end {end}")
    return start, end, None


def _channel(doc: Any, field: str) -> ChannelSpec:
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{field}: a channel is an object with at least an index")
    unknown = sorted(set(doc) - _CHANNEL_KEYS)
    if unknown:
        raise InvalidArgument(f"{field}.{unknown[0][:40]}: not a channel setting (use {sorted(_CHANNEL_KEYS)})")
    if "index" not in doc:
        raise InvalidArgument(f"{field}.index: every channel names its index")
    start, end, percentiles = _window(doc["window"], f"{field}.window") if "window" in doc else (None, None, None)
    gamma = _number(doc.get("gamma", 1.0), f"{field}.gamma")
    if not 0 < gamma <= MAX_GAMMA:
        raise InvalidArgument(f"{field}.gamma: {gamma} is not in (0, {MAX_GAMMA}]")
    return ChannelSpec(
        index=_index(doc["index"], f"{field}.index"),
        visible=_flag(doc.get("visible", True), f"{field}.visible"),
        color=normalised_colour(doc["color"], f"{field}.color") if "color" in doc else None,
        start=start,
        end=end,
        percentiles=percentiles,
        gamma=gamma,
        invert=_flag(doc.get("invert", False), f"{field}.invert"),
    )


def _plane(doc: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(doc, dict) or len(doc) > 16:
        raise InvalidArgument('plane: give the index of each other axis, e.g. {"z": 3, "t": 0}')
    out = []
    for name, value in doc.items():
        if name.lower() == "c" or not 0 < len(name) <= 40:
            raise InvalidArgument(f"plane.{name[:40]}: name an axis other than c (channels are chosen by channels)")
        out.append((name.lower(), _index(value, f"plane.{name}")))
    return tuple(sorted(out))


def _label_value(key: str) -> int:
    try:
        value = int(key, 10)
    except ValueError:
        value = None
    if value is None or not _ID_RANGE[0] <= value <= _ID_RANGE[1] or key.strip() != key:
        raise InvalidArgument(f"labels.colors.{key[:40]}: not a label value (a whole number in decimal)")
    return value


def _labels(doc: Any) -> LabelSpec:
    if not isinstance(doc, dict):
        raise InvalidArgument('labels: give {"name": "<label image>", "opacity": 0.5, "colors": {"7": "#FF0000"}}')
    unknown = sorted(set(doc) - _LABEL_KEYS)
    if unknown:
        raise InvalidArgument(f"labels.{unknown[0][:40]}: not a labels setting (use {sorted(_LABEL_KEYS)})")
    name = doc.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= 200:
        raise InvalidArgument("labels.name: name the label image (as the source lists it under labels/)")
    opacity = _number(doc.get("opacity", 0.5), "labels.opacity")
    if not 0 <= opacity <= 1:
        raise InvalidArgument(f"labels.opacity: {opacity} is not from 0 to 1")
    colors = doc.get("colors", {})
    if not isinstance(colors, dict) or len(colors) > MAX_LABEL_COLOURS:
        raise InvalidArgument(f'labels.colors: give at most {MAX_LABEL_COLOURS} colours by value, {{"7": "#FF0000"}}')
    by_value: dict[int, str] = {}
    for key, colour in colors.items():
        field = f"labels.colors.{key[:40]}"
        value = _label_value(key)
        text = normalised_colour(colour, field)
        if text in LUT_NAMES:
            raise InvalidArgument(f"{field}: {text!r} is a LUT; a label takes one colour, #RRGGBB or a tint name")
        if value in by_value:
            raise InvalidArgument(f"{field}: label {value} is given two colours")
        by_value[value] = text
    return LabelSpec(name, opacity, tuple(sorted(by_value.items())))


def _refuse_constant(name: str) -> float:
    raise InvalidArgument(f"the spec holds {name}, which is not a JSON number")


def parse_spec(body: bytes) -> RenderSpec:
    """The spec ``body`` holds (raises ``InvalidArgument`` naming the field at fault)."""
    if len(body) > MAX_SPEC_BYTES:
        raise InvalidArgument(f"the spec is {len(body)} bytes (limit {MAX_SPEC_BYTES})")
    try:
        doc = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, InvalidArgument):
            raise
        raise InvalidArgument(f"the spec is not JSON: {str(exc)[:120]}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument('the spec is a JSON object: {"channels": [...], "plane": {...}}')
    unknown = sorted(set(doc) - {"channels", "plane", "labels"})
    if unknown:
        raise InvalidArgument(f"{str(unknown[0])[:40]}: not a spec field (channels, plane, labels)")
    channels = doc.get("channels")
    if not isinstance(channels, list) or not channels:
        raise InvalidArgument("channels: give a list of at least one channel")
    if len(channels) > MAX_SPEC_CHANNELS:
        raise InvalidArgument(f"channels: {len(channels)} entries, at most {MAX_SPEC_CHANNELS}")
    parsed = tuple(_channel(c, f"channels[{i}]") for i, c in enumerate(channels))
    seen: dict[int, int] = {}
    for i, c in enumerate(parsed):
        if c.index in seen:
            raise InvalidArgument(
                f"channels[{i}].index: channel {c.index} is named again (first at channels[{seen[c.index]}])"
            )
        seen[c.index] = i
    visible = sum(c.visible for c in parsed)
    if not 0 < visible <= MAX_VISIBLE:
        raise InvalidArgument(f"channels: {visible} visible; a composite shows 1 to {MAX_VISIBLE}")
    labels = _labels(doc["labels"]) if "labels" in doc else None
    return RenderSpec(parsed, _plane(doc["plane"]) if "plane" in doc else (), labels)


def split_spec_id(identifier: str) -> tuple[str, str | None]:
    """``"id;z=3;r=0123abcd…"`` -> ``("id;z=3", "0123abcd…")``: the spec part of a viewer
    identifier taken out (the rest is ``render.plane``'s), or None when there is none."""
    if len(identifier) > MAX_IDENTIFIER:
        raise InvalidArgument(f"the identifier is {len(identifier)} characters (limit {MAX_IDENTIFIER})")
    array_id, *parts = identifier.split(";")
    specs = [p for p in parts if p.lower().startswith("r=")]
    if not specs:
        return identifier, None
    if len(specs) > 1:
        raise InvalidArgument(f"r: {array_id[:80]!r} names {len(specs)} render specs; name one")
    rest = [p for p in parts if not p.lower().startswith("r=")]
    if any(p.lower().startswith("c=") for p in rest):
        raise InvalidArgument("c: a render spec chooses the channels; give ;r= or ;c=, not both")
    return ";".join([array_id, *rest]), specs[0][2:]


class SpecStore:
    """Specs by id, bounded in count and bytes (oldest used first out; module docstring)."""

    def __init__(self, max_specs: int = MAX_STORED_SPECS, max_bytes: int = MAX_STORED_BYTES) -> None:
        self.max_specs, self.max_bytes = max_specs, max_bytes
        self._specs: OrderedDict[str, tuple[RenderSpec, int]] = OrderedDict()
        self._evicted: OrderedDict[str, None] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, spec: RenderSpec) -> str:
        """Store ``spec``; its id."""
        key, size = spec.id, len(spec.canonical())
        with self._lock:
            if key in self._specs:
                self._specs.move_to_end(key)
                return key
            self._specs[key] = (spec, size)
            self._bytes += size
            self._evicted.pop(key, None)
            while len(self._specs) > self.max_specs or self._bytes > self.max_bytes:
                old, (_, old_size) = self._specs.popitem(last=False)
                self._bytes -= old_size
                self._evicted[old] = None
                if len(self._evicted) > _EVICTED_REMEMBERED:
                    self._evicted.popitem(last=False)
        return key

    def get(self, spec_id: str) -> RenderSpec:
        """The spec ``spec_id`` names: a 400 for an id that is malformed or was never stored
        here, a 404 for one evicted (post it again)."""
        if len(spec_id) != ID_CHARS or not all(ch in "0123456789abcdef" for ch in spec_id):
            raise InvalidArgument(
                f"r: {spec_id[:40]!r} is not a render spec id ({ID_CHARS} hex digits from POST /render)"
            )
        with self._lock:
            hit = self._specs.get(spec_id)
            if hit is not None:
                self._specs.move_to_end(spec_id)
            evicted = spec_id in self._evicted
        if hit is not None:
            self._used(spec_id)
            return hit[0]
        loaded = self._load(spec_id)
        if loaded is not None:
            self.put(loaded)
            return loaded
        if evicted or self._gone(spec_id):
            raise RenderSpecEvicted(
                f"r: render spec {spec_id} was evicted (this server keeps the last {self.max_specs}); "
                "POST the spec to /render again: the same spec gets the same id"
            )
        raise InvalidArgument(
            f"r: render spec {spec_id} is not stored on this server (it restarted, or another process "
            "stored it); POST the spec to /render first"
        )

    # what a store shared between processes adds (``render.spec_store``); here, one process's
    def _used(self, spec_id: str) -> None:
        """``spec_id`` was just read from memory."""

    def _load(self, spec_id: str) -> RenderSpec | None:
        """``spec_id``'s spec from beyond this process's memory, if anywhere."""
        return None

    def _gone(self, spec_id: str) -> bool:
        """Whether ``spec_id`` was evicted beyond this process's memory."""
        return False


def resolve(
    spec: RenderSpec,
    count: int,
    defaults: Callable[[int], tuple[tuple[int, int, int], float, float]],
    percentiles: Callable[[int, float, float], tuple[float, float]],
    where: str,
) -> tuple[tuple[int, ...], list[Channel]]:
    """(the visible channel indices, their kernel settings) of ``spec`` for a tensor of
    ``count`` channels (``where`` names it). ``defaults(i)``: channel ``i``'s own (colour,
    start, end); ``percentiles(i, low, high)``: its percentile window (``render.histogram``),
    measured only for a spec that asks for one."""
    indices, channels = [], []
    for k, c in enumerate(spec.channels):
        if c.index >= count:
            raise InvalidArgument(
                f"channels[{k}].index: {where} has no channel {c.index} ({count} channel{'s' if count > 1 else ''}, "
                f"0 to {count - 1}) (render spec {spec.id})"
            )
        if not c.visible:
            continue
        colour, start, end = defaults(c.index)
        if c.start is not None and c.end is not None:
            start, end = c.start, c.end
        elif c.percentiles is not None:
            start, end = percentiles(c.index, *c.percentiles)
        r, g, b = colour
        value = colour_value(c.color) if c.color is not None else (r / 255, g / 255, b / 255)
        indices.append(c.index)
        channels.append(Channel(start, end, value, c.gamma, c.invert))
    return tuple(indices), channels
