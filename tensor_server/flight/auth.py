"""Bearer-token auth (wire-protocol §10).

The middleware only records the presented token; the serving runtime decides, so ``health``
stays open (the SDK's protocol check must work before the user's token is known to be right)
while every other call requires the token when one is configured.
"""

from __future__ import annotations

import pyarrow.flight as flight

from tensor_server.service.access import bearer_token

__all__ = ["TokenMiddlewareFactory", "presented_token"]

MIDDLEWARE_KEY = "auth"


class _TokenMiddleware(flight.ServerMiddleware):
    def __init__(self, presented: str | None) -> None:
        self.presented = presented


class TokenMiddlewareFactory(flight.ServerMiddlewareFactory):
    def start_call(self, info, headers):  # pyarrow signature
        """The presented token's holder, or None for a call that presents none: pyarrow
        then calls nothing more of it (an instance costs the call two more entries into
        Python, ``sending_headers`` and ``call_completed``, each a turn for the GIL)."""
        values = headers.get("authorization") or headers.get("Authorization") or []
        presented = None
        for v in values:
            token = bearer_token(v.decode() if isinstance(v, bytes) else v)
            presented = token if token is not None else presented
        return None if presented is None else _TokenMiddleware(presented)


def presented_token(context: flight.ServerCallContext) -> str | None:
    """The bearer token the call presented (None: none). Whether it is right is the
    serving runtime's decision (``ServingRuntime.authenticate``), not this door's."""
    mw = context.get_middleware(MIDDLEWARE_KEY)
    return getattr(mw, "presented", None)
