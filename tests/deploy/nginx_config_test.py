"""``nginx-config``: the text it prints (what each directive is there for, tensor_server/deploy/
nginx.py), that nginx itself accepts it, and every bad flag refused naming itself."""

from __future__ import annotations

import subprocess

import pytest

from tensor_server.cli import main
from tensor_server.deploy.nginx import Address, NginxConfigError, parse_addresses, parse_listen
from tensor_server.deploy.nginx_process import nginx_binary

FLAGS = ["--http", "127.0.0.1:9001,[::1]:9002,replica-3.lab:8816", "--flight", "127.0.0.1:9101,10.0.0.3:8815"]
LISTEN = ["--listen-http", "8080", "--listen-flight", "127.0.0.1:8815"]


def _config(capsys, *extra: str) -> str:
    assert main(["nginx-config", *FLAGS, *LISTEN, *extra]) == 0
    return capsys.readouterr().out


def test_http_upstreams_hash_the_token_free_path_and_retry_elsewhere(capsys):
    text = _config(capsys)
    http = text.split("upstream tensor_server_http {")[1].split("}")[0]
    assert "hash $tensor_server_key consistent;" in http
    assert [line.split()[1] for line in http.splitlines() if line.strip().startswith("server ")] == [
        "127.0.0.1:9001",
        "[::1]:9002",
        "replica-3.lab:8816",
    ]
    assert '"~^/t/[^/?]*(?<path>/[^?]*)?" $path;' in text  # /t/<token>/ and the query left out
    assert '"~^(?<path>/[^?]*)" $path;' in text
    assert "proxy_next_upstream error timeout http_502 http_503 http_504;" in text
    assert "proxy_next_upstream_tries 3;" in text  # each replica once at most
    assert "proxy_set_header Host $http_host;" in text and "proxy_http_version 1.1;" in text
    assert "listen 8080;" in text and "$request " not in text  # the log names the key, never a token


def test_grpc_is_balanced_per_connection_on_an_http2_listener(capsys):
    text = _config(capsys, "--server-name", "tiles.example.org")
    flight = text.split("upstream tensor_server_flight {")[1].split("}")[0]
    assert "hash $connection;" in flight and "server 10.0.0.3:8815 max_fails=1" in flight
    assert "listen 127.0.0.1:8815 http2;" in text and "grpc_pass grpc://tensor_server_flight;" in text
    assert "grpc_next_upstream_tries 2;" in text and "client_max_body_size 0;" in text
    assert text.count("server_name tiles.example.org;") == 2
    assert "\nuser " not in text  # runs as whoever starts it


@pytest.mark.parametrize(
    "flag, value, said",
    [
        ("--http", "127.0.0.1", "--http: '127.0.0.1' is not HOST:PORT with a port from 1 to 65535"),
        ("--http", "127.0.0.1:0", "a port from 1 to 65535"),
        ("--http", "127.0.0.1:70000", "a port from 1 to 65535"),
        ("--http", "bad_host:80", "'bad_host' is not a host name or IP address"),
        ("--http", "::1:80", "an IPv6 address goes in brackets, [::1]:80"),
        ("--http", "a:1,a:1", "--http: a:1 is listed twice"),
        ("--http", ",", "expected HOST:PORT[,HOST:PORT...]"),
        ("--http", "8080", "--http: '8080' is not HOST:PORT: no host before the port"),
        ("--http", "[name]:80", "'name' is not a host name or IP address"),
        ("--flight", "h:1;evil", "--flight: 'h:1;evil' is not HOST:PORT"),
        ("--listen-flight", "8080", "--listen-http and --listen-flight are both port 8080"),
        ("--listen-http", "x y:80", "--listen-http: 'x y:80' is not PORT or HOST:PORT"),
        ("--server-name", "a;b", "--server-name: 'a;b' is not a host name"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag_and_value(capsys, flag, value, said):
    args = {"--http": "h:1", "--flight": "h:2", "--listen-http": "8080", "--listen-flight": "8815"}
    args[flag] = value
    assert main(["nginx-config", *[x for pair in args.items() for x in pair]]) == 2
    captured = capsys.readouterr()
    assert said in captured.err and captured.out == ""


def test_a_port_in_both_lists_is_refused(capsys):
    assert main(["nginx-config", "--http", "h:1,h:2", "--flight", "h:2", *LISTEN]) == 2
    assert "h:2 is in both --http and --flight" in capsys.readouterr().err


def test_addresses_parse_to_host_and_port():
    assert parse_addresses(" A.example:1, [::1]:2 ", "--http") == [Address("a.example", 1), Address("::1", 2)]
    assert parse_listen("8080", "--listen-http") == Address("", 8080)
    assert parse_listen("[::]:8080", "--listen-http") == Address("::", 8080)
    with pytest.raises(NginxConfigError, match="--flight: 'h' is not HOST:PORT"):
        parse_addresses("h", "--flight")


def test_nginx_accepts_the_file_unprivileged_under_its_prefix(tmp_path, capsys):
    nginx = nginx_binary()
    if nginx is None:
        pytest.skip("nginx is not installed (make test installs Debian's nginx with apt; see the Makefile)")
    conf = tmp_path / "nginx.conf"
    conf.write_text(_config(capsys).replace("replica-3.lab", "localhost"))  # a name that resolves here
    done = subprocess.run([nginx, "-t", "-c", str(conf), "-p", f"{tmp_path}/"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "test is successful" in done.stderr
    assert {p.name for p in tmp_path.iterdir()} >= {"client_body_temp", "proxy_temp", "error.log", "access.log"}
