"""`api.listen` values: `HOST:PORT`, `[IPV6]:PORT`, or "" (the API is off); where a local client
reaches a server bound so. Pure: the config checks them, the API binds by them, the CLI connects."""

from __future__ import annotations


def parse_listen(value: str) -> tuple[str, int]:
    """(host, port); raises ValueError with a message naming the problem."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"api.listen {value!r}: expected HOST:PORT, e.g. 127.0.0.1:52415")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def parse_peer(value: str, default_port: int) -> tuple[str, int]:
    """A `cluster.peers` entry, `HOST`, `HOST:PORT` or `[IPV6]:PORT`, as (host, port); raises
    ValueError naming the problem."""
    host, port = value, str(default_port)
    if "]:" in value or not value.startswith("[") and value.count(":") == 1:
        host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{value!r}: expected HOST or HOST:PORT, the port from 1 to 65535")
    return host.removeprefix("[").removesuffix("]"), int(port)


def client_host(host: str) -> str:
    """Where a local client connects to reach a server bound to `host`."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def url(host: str, port: int) -> str:
    h = client_host(host)
    return f"http://[{h}]:{port}" if ":" in h else f"http://{h}:{port}"
