"""The command line's parser (``python -m tensor_server``'s commands, flags and help) and the
reference page generated from it (``docs/cli.md``, checked by tests/readme_test.py); the
commands themselves are in ``cli.py``."""

from __future__ import annotations

import argparse

__all__ = ["DEMO_HTTP_PORT", "DEMO_METRICS_PORT", "build_parser", "cli_reference"]

#: the HTTP port ``run`` (``make run``) serves OME-Zarr on, and ``url`` assumes
DEMO_HTTP_PORT = 8816
#: the Prometheus /metrics port ``run`` turns on (loopback)
DEMO_METRICS_PORT = 8817


def _count(text: str) -> int:
    """argparse type for an integer >= 0 (a clear usage error otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _workers(text: str) -> int:
    """argparse type of ``--workers``: an integer >= 1, or ``auto`` (the cores)."""
    import os

    if text == "auto":
        return os.cpu_count() or 1
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'auto', got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tensor-server", description="Serve bio-imaging files as N-D tensors over Arrow Flight (biopb protocol)."
    )
    sub = p.add_subparsers(dest="command", required=True)

    def server_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--host", help="bind address (default 127.0.0.1; non-loopback needs --token)")
        sp.add_argument("--port", type=int, help="port (default 8815; 0 picks a free one)")
        sp.add_argument("--config", help="TOML config file (flags override it)")
        sp.add_argument("--token", help="require 'authorization: Bearer TOKEN' on every call but health")
        sp.add_argument(
            "--cache-dir",
            help="chunk cache folder (default: <cache home>/chunks, or chunks-<port> when another server holds that)",
        )
        sp.add_argument(
            "--rois-db",
            help="ROI annotation file (default: <data home>/annotations.duckdb, or "
            "annotations-<port>.duckdb when another server holds that)",
        )
        sp.add_argument("--cache-max-bytes", type=int, help="chunk cache file-tier budget in bytes (default 4 GiB)")
        sp.add_argument("--write-dir", help="folder for uploaded tensors and the scratch source")
        sp.add_argument(
            "--writable",
            action="store_true",
            default=None,
            help="accept uploads over Flight (add_tensor, DoPut, set_upload_status); needs --write-dir",
        )
        sp.add_argument("--rescan-seconds", type=float, help="rescan the roots this often (0 = never)")
        sp.add_argument(
            "--read-workers",
            type=_count,
            help="threads a scaled read decodes its units on, from a shared pool (default 0 = the cores)",
        )
        sp.add_argument(
            "--montage-gap",
            type=float,
            metavar="FRACTION",
            help="gap between a plate's wells or a file's positions in their one-image montage, "
            "a fraction of a cell from 0 to 1 (default 0.0625)",
        )
        sp.add_argument("--log-level", help="debug, info, warning (default), error")
        sp.add_argument(
            "--read-only",
            action="store_true",
            default=None,
            help="refuse every verb that writes anything (uploads, added sources, annotations)",
        )
        sp.add_argument(
            "--no-add-source",
            dest="add_source",
            action="store_false",
            default=None,
            help="refuse add_source / remove_source: serve the roots only",
        )
        sp.add_argument(
            "--http-port",
            type=int,
            help="also serve every tensor as OME-Zarr over HTTP on this port (serve: off by default; run: 8816)",
        )
        # transport and browser safety (docs/security.md; service/tls.py, http/security.py)
        sp.add_argument(
            "--tls",
            action="store_true",
            default=None,
            help="TLS on both doors with a self-signed certificate minted once in the cache home",
        )
        sp.add_argument("--tls-cert", help="serve TLS with this PEM certificate (chain, leaf first); needs --tls-key")
        sp.add_argument("--tls-key", help="the unencrypted PEM private key of --tls-cert")
        sp.add_argument(
            "--san",
            action="append",
            metavar="NAME",
            help="a name clients dial: added to a minted certificate and to the allowed HTTP Hosts",
        )
        sp.add_argument(
            "--insecure",
            action="store_true",
            default=None,
            help="serve plaintext off loopback (the token and pixels travel in cleartext)",
        )
        sp.add_argument(
            "--no-http-token",
            dest="http_token",
            action="store_false",
            default=None,
            help="do not require the HTTP access token (non-browser clients only)",
        )
        sp.add_argument(
            "--rotate-http-token",
            action="store_true",
            help="replace the HTTP access token kept in <cache home>/http/token (URLs with the old one stop working)",
        )
        sp.add_argument(
            "--cors-origin",
            action="append",
            metavar="ORIGIN",
            help="an origin allowed CORS reads; its requests still need a token unless --no-http-token",
        )
        sp.add_argument(
            "--metrics-port",
            type=int,
            help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics "
            f"(serve: off by default; run: {DEMO_METRICS_PORT}; docs/operating.md)",
        )
        sp.add_argument("--log-format", choices=("text", "json"), help="log lines as key=value text (default) or JSON")
        sp.add_argument(
            "--request-log",
            metavar="FILE",
            help="where the request log (a line per request) goes: a file, "
            "'-' for stderr or 'off' (serve: stderr; run: <cache home>/logs/requests.log)",
        )

    serve = sub.add_parser("serve", help="serve the sources found under ROOTs")
    serve.add_argument("roots", nargs="*", metavar="ROOT")
    server_flags(serve)
    serve.add_argument(
        "--workers",
        type=_workers,
        default=1,
        metavar="N",
        help="serve HTTP from N processes on one port ('auto': the cores); the first owns writes and "
        "Flight, all share the chunk cache (docs/operating.md)",
    )

    run = sub.add_parser(
        "run", help="serve ROOTs, or a generated demo dataset when none is given, and print how to read"
    )
    run.add_argument("roots", nargs="*", metavar="ROOT")
    run.add_argument("--demo-dir", help="where the demo dataset is written (default: <cache home>/demo)")
    server_flags(run)

    lst = sub.add_parser("list", help="print the sources and tensors found under ROOTs")
    lst.add_argument("roots", nargs="+", metavar="ROOT")

    url = sub.add_parser("url", help="print the OME-Zarr URL of a file or array id, to paste into a viewer")
    url.add_argument("target", metavar="PATH_OR_ARRAY_ID")
    url.add_argument("--host", default="127.0.0.1", help="the server's address (default 127.0.0.1)")
    url.add_argument(
        "--http-port", type=int, default=DEMO_HTTP_PORT, help=f"its --http-port (default {DEMO_HTTP_PORT})"
    )
    url.add_argument(
        "--ngff", choices=("0.4", "0.5"), default="0.4", help="NGFF 0.4 (zarr v2, default) or 0.5 (zarr v3)"
    )
    stats = sub.add_parser(
        "stats",
        help="print min/max/sum/mean/count_nonzero of every tensor of a file or folder (JSON lines; "
        "under a folder that is not one dataset, each line names its file)",
    )
    stats.add_argument("path", metavar="PATH")
    stats.add_argument("--field", help="only this tensor of the source")
    stats.add_argument("--slice", help="a region, numpy style per axis: '0:10,:,100:200'")
    stats.add_argument("--no-special-chunks", action="store_true", help="decode every block (for comparison)")

    from tensor_server.export.command import add_arguments as export_arguments

    export_arguments(sub.add_parser("export", help="write a tensor as a pyramidal, sharded OME-Zarr (docs/export.md)"))
    from tensor_server.deploy.nginx import add_arguments as nginx_arguments

    nginx_arguments(
        sub.add_parser(
            "nginx-config",
            help="print a complete nginx.conf (for nginx -c FILE -p PREFIX) balancing read-only replicas' "
            "HTTP and Flight doors (docs/deploying.md)",
        )
    )
    share_arguments(
        sub.add_parser(
            "share",
            help="make a link that reads one tensor until it expires; list or revoke links (docs/security.md)",
        )
    )
    sub.add_parser("version", help="print the version")
    return p


def _duration(text: str) -> int:
    from tensor_server.errors import InvalidArgument
    from tensor_server.service.shares import parse_duration

    try:
        return parse_duration(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def share_arguments(parser: argparse.ArgumentParser) -> None:
    from tensor_server.service.shares import SCOPES

    parser.add_argument("array_id", nargs="?", metavar="ARRAY_ID", help="the tensor to share (not with --list)")
    parser.add_argument(
        "--expires", type=_duration, default="7d", metavar="DURATION", help="how long it reads: 30m, 12h, 7d, 2w"
    )
    parser.add_argument("--scope", choices=SCOPES, default="read", help="read, or read and annotate the tensor")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="list the links you made (the server token: all)")
    what.add_argument("--revoke", metavar="ID", help="revoke a link: refused from the next request on")
    what.add_argument(
        "--rotate-secret", action="store_true", help="a new share secret: every link made before is refused"
    )
    parser.add_argument(
        "--server", default="grpc://127.0.0.1:8815", help="the server's Flight location (default grpc://127.0.0.1:8815)"
    )
    parser.add_argument("--token", help="the server token or the tensor owner's (default: $TENSOR_SERVER_TOKEN)")


def cli_reference() -> str:
    """``docs/cli.md``: every command and flag of the parser as Markdown. Generated, so the
    reference says what ``--help`` says (``tests/readme_test.py`` compares the file with it).
    Regenerate: ``python -c 'import tensor_server.cli_parser as c; print(c.cli_reference(), end="")' > docs/cli.md``."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {choice.dest: choice.help for choice in commands._choices_actions}
    out = [
        "# Command-line reference",
        "",
        "<!-- generated from the argparse parser by tensor_server.cli_parser.cli_reference(); do not edit -->",
        "",
        f"`{parser.prog} <command> [arguments]`: {parser.description} Commands:",
        "",
    ]
    out += [f"- [`{name}`](#{name}): {summaries[name]}" for name in commands.choices]
    for name, command in commands.choices.items():
        out += ["", f"## {name}", "", f"{summaries[name][0].upper()}{summaries[name][1:]}.", ""]
        arguments = [a for a in command._actions if not isinstance(a, argparse._HelpAction)]
        if not arguments:
            out.append("No arguments.")
            continue
        out += ["| argument | value | default | what it does |", "|---|---|---|---|"]
        out += [_argument_row(a) for a in arguments]
        for group in command._mutually_exclusive_groups:
            out += ["", " and ".join(f"`{a.option_strings[0]}`" for a in group._group_actions) + " exclude each other."]
    return "\n".join(out) + "\n"


def _argument_row(action: argparse.Action) -> str:
    """One table row: the argument, the value it takes, its default and its help text."""
    name = ", ".join(action.option_strings) or action.metavar or action.dest
    if action.nargs == 0:
        value = "(a switch)"
    elif action.choices:
        value = " \\| ".join(f"`{c}`" for c in action.choices)
    else:
        value = (
            f"`{action.metavar or action.dest.upper()}`"
            if action.option_strings
            else {"*": "zero or more", "+": "one or more"}.get(str(action.nargs), "one")
        )
    if isinstance(action, argparse._AppendAction):
        value += ", repeatable"
    default = "" if action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0 else f"`{action.default}`"
    what = (action.help or "").replace("|", "\\|").replace("<", "\\<")  # not a table cell's end, not an HTML tag
    return f"| `{name}` | {value} | {default} | {what} |"
