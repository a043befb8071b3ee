"""Numbers in viewer URLs (IIIF parameters, DeepZoom tile paths, plane selectors), checked as
text before any arithmetic touches them.

A number is ASCII digits only (``str.isdigit`` also accepts '²', which ``int`` refuses, and
``int`` reads '١٢' as 12), at most ``MAX_DIGITS`` of them before an optional fraction: never
more than 999,999,999, past any image side, so every product and float made of it is finite
and exact enough. Anything else is an ``InvalidArgument`` (400) naming the field, never an
``OverflowError`` or ``ValueError`` (500). The checks are plain string tests, linear in the
text (no regular expression over client text).
"""

from __future__ import annotations

from tensor_server.errors import InvalidArgument

__all__ = ["whole_number", "decimal_number", "MAX_DIGITS"]

#: digits of a whole number, or of a decimal's whole part
MAX_DIGITS = 9
#: digits after a decimal's point (a JavaScript float printed in full has 17 significant digits)
MAX_FRACTION_DIGITS = 20
#: characters of a refused number repeated in its error
_ECHO = 24


def _digits(text: str, limit: int) -> bool:
    return 0 < len(text) <= limit and text.isascii() and text.isdigit()


def whole_number(text: str, what: str) -> int:
    """``text`` as a non-negative int of at most ``MAX_DIGITS`` ASCII digits."""
    if not _digits(text, MAX_DIGITS):
        raise InvalidArgument(f"{what} {text[:_ECHO]!r} is not a whole number of 1 to {MAX_DIGITS} digits (0-9)")
    return int(text)


def decimal_number(text: str, what: str) -> float:
    """``text`` (``n`` or ``n.f``) as a non-negative finite float."""
    whole, point, fraction = text.partition(".")
    if not _digits(whole, MAX_DIGITS) or (point and not _digits(fraction, MAX_FRACTION_DIGITS)):
        raise InvalidArgument(
            f"{what} {text[:_ECHO]!r} is not a number of 1 to {MAX_DIGITS} digits (0-9), "
            f"optionally with a fraction (12.5)"
        )
    return float(text)
