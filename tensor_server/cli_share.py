"""``python -m tensor_server share`` (its flags: ``cli_parser.share_arguments``): make, list,
revoke share links of a running server, over
its Flight actions (``share``, ``share_list``, ``share_revoke``, ``share_rotate``; the rules
are the server's, ``service/access.py``: the server token or the tensor's owner)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

__all__ = ["run", "TOKEN_VARIABLE"]

#: where the token comes from when ``--token`` is not given (a flag would sit in shell history)
TOKEN_VARIABLE = "TENSOR_SERVER_TOKEN"


def _call(args: argparse.Namespace, name: str, body: dict[str, Any]) -> Any:
    import pyarrow.flight as flight

    from tensor_server.config import default_cache_dir

    token = args.token or os.environ.get(TOKEN_VARIABLE)
    pinned = default_cache_dir() / "tls" / "server-cert.pem"  # the server's self-signed certificate
    kwargs = {"tls_root_certs": pinned.read_bytes()} if args.server.startswith("grpcs") and pinned.exists() else {}
    client = flight.FlightClient(args.server, **kwargs)
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    try:
        action = flight.Action(name, json.dumps(body).encode())
        results = list(client.do_action(action, flight.FlightCallOptions(headers=headers, timeout=30)))
    finally:
        client.close()
    return json.loads(results[0].body.to_pybytes())


def _when(seconds: float | None) -> str:
    return "-" if seconds is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def run(args: argparse.Namespace) -> int:
    import pyarrow.flight as flight

    if not (args.list or args.revoke or args.rotate_secret or args.array_id):
        print("share: name the ARRAY_ID to share, or pass --list, --revoke ID or --rotate-secret", file=sys.stderr)
        return 2
    try:
        if args.list:
            for link in _call(args, "share_list", {})["links"]:
                print(f"{link['id']}  {link['state']:<8} {link['scope']:<14} until {_when(link['expires_at'])}  "
                      f"{link['array_id']}")  # fmt: skip
        elif args.revoke:
            link = _call(args, "share_revoke", {"id": args.revoke})
            print(f"revoked {link['id']} ({link['array_id']}) at {_when(link['revoked_at'])}")
        elif args.rotate_secret:
            print(f"a new share secret: {_call(args, 'share_rotate', {})['forgotten']} links refused from now on")
        else:
            body = {"array_id": args.array_id, "expires_seconds": args.expires, "scope": args.scope}
            made = _call(args, "share", body)
            print(made["url"])
            print(f"id {made['id']}, {made['scope']} until {_when(made['expires_at'])}", file=sys.stderr)
    except flight.FlightError as exc:
        print(f"share: {str(exc).splitlines()[0][:500]}", file=sys.stderr)
        return 1
    return 0
