"""``python -m tensor_server nginx-config``: a complete nginx.conf putting read-only replicas
behind one HTTP port and one gRPC (Flight) port (docs/deploying.md explains the topology).

Why each part is as it is:

* **HTTP: consistent hashing on the path.** A tile or chunk URL always lands on the same
  replica, so its chunks are decoded and cached once, on one machine, not once per replica.
  The key is the path without the ``/t/<token>/`` prefix and without the query, so a tile read
  with the token in its path and the same tile read with ``Authorization`` share a replica, and
  the access log never holds a token (it logs the key, not the request line).
* **The client's Host goes through** (``$http_host``, port included): the HTTP door refuses a
  Host it does not know (DNS-rebinding guard, ``http/security.py``), compares ``Origin`` with it,
  and writes it into the URLs it returns (IIIF ``info.json`` ids, the catalog page's links), which
  must name the balancer, not a replica. A name other than loopback must be given to every
  replica with ``--san NAME``. ``X-Forwarded-Proto`` tells a replica the client's scheme when TLS
  ends at nginx (uvicorn trusts it from ``FORWARDED_ALLOW_IPS``, loopback by default).
* **A dead replica is retried on another** (``proxy_next_upstream`` / ``grpc_next_upstream``, at
  most once per replica, a 2 s connect timeout) and set aside for ``fail_timeout``.
* **gRPC balanced per connection** (``hash $connection``): the calls of one client connection
  go to one replica, so a client's reads stay in few caches, while many clients spread over
  all (nginx would otherwise pick a replica per call; a Flight ticket is self-contained, so
  either works). Calls are retried even after being sent (``non_idempotent``): every call a
  ``--read-only`` replica accepts is a read.
* **Runs unprivileged**: no ``user`` directive; pid, logs and temporary files are relative
  paths, under the prefix given with ``nginx -p PREFIX``.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Address", "NginxConfigError", "add_arguments", "nginx_config", "parse_addresses", "parse_listen", "run"]

#: a DNS name: dot-separated labels of letters, digits and inner hyphens
_DNS_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
#: seconds: a replica that does not accept a connection in this long is taken for dead
CONNECT_SECONDS = 2
#: seconds a replica is set aside after a failure before it is tried again
FAIL_SECONDS = 10
#: seconds between two reads of a reply: a cold tile of a large image computes for seconds
HTTP_READ_SECONDS = 300
#: seconds between two messages of a gRPC stream (a cold scaled read computes before its first)
GRPC_STREAM_SECONDS = 600


class NginxConfigError(ValueError):
    """A flag of ``nginx-config`` that cannot make a configuration (the message names it)."""


@dataclass(frozen=True)
class Address:
    host: str  # a DNS name or an IP literal (IPv6 without brackets)
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _host(text: str) -> str | None:
    """``text`` as a host nginx can dial (an IP literal or a DNS name), or None."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return text.lower() if _DNS_NAME.match(text) else None


def _address(item: str, flag: str, *, port_only: bool = False) -> Address:
    """One ``HOST:PORT`` (``[IPV6]:PORT``), or with ``port_only`` also a bare ``PORT``."""
    text, form = item.strip(), "PORT or HOST:PORT" if port_only else "HOST:PORT"
    bracketed = text.startswith("[")
    if port_only and text.isdigit():
        host, port_text = "", text
    elif bracketed:
        host, bracket, rest = text[1:].partition("]")
        port_text = rest[1:] if bracket and rest.startswith(":") else ""
    else:
        host, _, port_text = text.rpartition(":")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise NginxConfigError(f"{flag}: {item!r} is not {form} with a port from 1 to 65535")
    if ":" in host and not bracketed:
        raise NginxConfigError(f"{flag}: {item!r}: an IPv6 address goes in brackets, [{host}]:{port_text}")
    name = _host(host) if host and (":" in host) == bracketed else None
    if name is None and (host or not port_only):
        what = f"{host!r} is not a host name or IP address" if host else "no host before the port"
        raise NginxConfigError(f"{flag}: {item!r} is not {form}: {what}")
    return Address(name or "", int(port_text))


def parse_addresses(text: str, flag: str) -> list[Address]:
    """The comma-separated ``HOST:PORT`` list of ``flag``: at least one, none twice."""
    items = [t for t in text.split(",") if t.strip()]
    if not items:
        raise NginxConfigError(f"{flag}: expected HOST:PORT[,HOST:PORT...], got {text!r}")
    out: list[Address] = []
    for item in items:
        address = _address(item, flag)
        if address in out:
            raise NginxConfigError(f"{flag}: {address} is listed twice")
        out.append(address)
    return out


def parse_listen(text: str, flag: str) -> Address:
    """What nginx listens on: ``PORT`` (every address) or ``HOST:PORT``."""
    return _address(text, flag, port_only=True)


def _upstream(name: str, balance: str, servers: Sequence[Address]) -> list[str]:
    lines = [f"    upstream {name} {{", f"        {balance};"]
    lines += [f"        server {s} max_fails=1 fail_timeout={FAIL_SECONDS}s;" for s in servers]
    return lines + ["        keepalive 16;", "    }"]


def _listen_text(address: Address) -> str:
    return str(address) if address.host else str(address.port)


def _listen(address: Address, extra: str = "") -> str:
    return f"        listen {_listen_text(address)}{extra};"


def nginx_config(
    http: Sequence[Address],
    flight: Sequence[Address],
    listen_http: Address,
    listen_flight: Address,
    server_name: str | None = None,
) -> str:
    """The nginx.conf (see the module docstring for why each part is there)."""
    name = [f"        server_name {server_name};"] if server_name else []
    command = (
        f"python -m tensor_server nginx-config --http {','.join(map(str, http))} "
        f"--flight {','.join(map(str, flight))} --listen-http {_listen_text(listen_http)} "
        f"--listen-flight {_listen_text(listen_flight)}" + (f" --server-name {server_name}" if server_name else "")
    )
    lines = [
        "# nginx in front of read-only tensor-server replicas (docs/deploying.md).",
        f"# Generated by: {command}",
        "# Run: nginx -c /full/path/nginx.conf -p PREFIX/   (pid, logs and temporary files under PREFIX)",
        "worker_processes auto;",
        "pid nginx.pid;",
        "error_log error.log warn;",
        "",
        "events {",
        "    worker_connections 1024;",
        "}",
        "",
        "http {",
        "    client_body_temp_path client_body_temp;",
        "    proxy_temp_path proxy_temp;",
        "    fastcgi_temp_path fastcgi_temp;",
        "    uwsgi_temp_path uwsgi_temp;",
        "    scgi_temp_path scgi_temp;",
        "    server_tokens off;",
        "",
        "    # The path without its /t/<token>/ prefix and without the query: the replica a URL is",
        "    # hashed to, and what the access log shows (a token never reaches the log).",
        "    map $request_uri $tensor_server_key {",
        '        "~^/t/[^/?]*(?<path>/[^?]*)?" $path;  # empty for a bare /t/<token>',
        '        "~^(?<path>/[^?]*)" $path;',
        "        default /;",
        "    }",
        "    log_format tensor_server '$remote_addr [$time_local] $request_method $tensor_server_key '",
        "                             '$status $body_bytes_sent upstream=$upstream_addr '",
        "                             'upstream_status=$upstream_status seconds=$request_time';",
        "    access_log access.log tensor_server;",
        "",
        "    # OME-Zarr, IIIF, DeepZoom and the catalog page: a URL is always served by one replica.",
        *_upstream("tensor_server_http", "hash $tensor_server_key consistent", http),
        "",
        "    # Arrow Flight (the biopb SDK): every call of one client connection to one replica.",
        *_upstream("tensor_server_flight", "hash $connection", flight),
        "",
        "    server {",
        _listen(listen_http),
        *name,
        "        client_max_body_size 1m;  # the HTTP door answers GET and HEAD only",
        "        location / {",
        "            proxy_pass http://tensor_server_http;",
        "            proxy_http_version 1.1;",
        '            proxy_set_header Connection "";',
        "            proxy_set_header Host $http_host;",
        "            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
        "            proxy_set_header X-Forwarded-Proto $scheme;",
        "            proxy_redirect off;",
        f"            proxy_connect_timeout {CONNECT_SECONDS}s;",
        f"            proxy_read_timeout {HTTP_READ_SECONDS}s;",
        "            proxy_next_upstream error timeout http_502 http_503 http_504;",
        f"            proxy_next_upstream_tries {len(http)};",
        "            # a tile or a chunk (up to a few MiB) is taken whole from the replica into memory,",
        "            # freeing it for the next request; a larger body streams, never spooled to disk",
        "            proxy_buffering on;",
        "            proxy_buffer_size 16k;",
        "            proxy_buffers 64 64k;",
        "            proxy_busy_buffers_size 256k;",
        "            proxy_max_temp_file_size 0;",
        "        }",
        "    }",
        "",
        "    server {",
        _listen(listen_flight, " http2"),
        *name,
        "        client_max_body_size 0;  # a DoPut or DoExchange stream has no set length",
        f"        client_body_timeout {GRPC_STREAM_SECONDS}s;",
        "        location / {",
        "            grpc_pass grpc://tensor_server_flight;",
        f"            grpc_connect_timeout {CONNECT_SECONDS}s;",
        f"            grpc_read_timeout {GRPC_STREAM_SECONDS}s;",
        f"            grpc_send_timeout {GRPC_STREAM_SECONDS}s;",
        "            grpc_buffer_size 64k;  # room for a long error message in the reply's headers",
        "            grpc_next_upstream error timeout http_502 http_503 http_504 non_idempotent;",
        f"            grpc_next_upstream_tries {len(flight)};",
        "        }",
        "    }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--http",
        required=True,
        metavar="HOST:PORT[,...]",
        help="every replica's HTTP door (its --http-port), comma-separated",
    )
    p.add_argument(
        "--flight",
        required=True,
        metavar="HOST:PORT[,...]",
        help="every replica's Flight door (its --port), comma-separated",
    )
    p.add_argument(
        "--listen-http", required=True, metavar="[HOST:]PORT", help="where nginx serves HTTP (OME-Zarr, IIIF, pages)"
    )
    p.add_argument(
        "--listen-flight", required=True, metavar="[HOST:]PORT", help="where nginx serves gRPC (Flight, the SDK)"
    )
    p.add_argument(
        "--server-name",
        metavar="NAME",
        help="the name clients dial (nginx's server_name); give it to every replica with --san NAME",
    )


def run(args: argparse.Namespace) -> int:
    """Print the configuration, or say which flag is wrong (exit 2)."""
    try:
        http, flight = parse_addresses(args.http, "--http"), parse_addresses(args.flight, "--flight")
        listen_http = parse_listen(args.listen_http, "--listen-http")
        listen_flight = parse_listen(args.listen_flight, "--listen-flight")
        if listen_http.port == listen_flight.port:
            raise NginxConfigError(f"--listen-http and --listen-flight are both port {listen_http.port}")
        both = set(http) & set(flight)
        if both:
            raise NginxConfigError(f"{min(both, key=str)} is in both --http and --flight (one door per port)")
        if args.server_name is not None and (args.server_name.startswith("[") or _host(args.server_name) is None):
            raise NginxConfigError(f"--server-name: {args.server_name!r} is not a host name or IP address")
    except NginxConfigError as exc:
        print(f"nginx-config: {exc}", file=sys.stderr)
        return 2
    print(nginx_config(http, flight, listen_http, listen_flight, args.server_name), end="")
    return 0
