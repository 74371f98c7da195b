"""What keeps a web page the user happens to visit from driving the API.

- Host allow-list (DNS rebinding): a page on attacker.example whose name later resolves to
  127.0.0.1 sends `Host: attacker.example`. Accepted are IP literals (they cannot be rebound),
  localhost, the listen address and `api.allowed_hosts`.
- JSON only: a plain HTML form can POST `text/plain` without a CORS preflight; the generation
  endpoints take `application/json` only, which a browser never sends cross-origin without
  asking first.
- CORS stays off (no Access-Control-* headers at all) unless `api.cors_origins` lists origins.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

PREFLIGHT_HEADERS = {
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
    "Access-Control-Allow-Headers": "Authorization, Content-Type",
    "Access-Control-Max-Age": "600",
}


def host_name(header: str) -> str:
    """The name part of a Host header: `example:80` → example, `[::1]:80` → ::1."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:].partition("]")[0]
    if h.count(":") == 1:
        h = h.partition(":")[0]
    return h.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


class HostPolicy:
    def __init__(self, listen_hosts: Iterable[str], allowed: Iterable[str]) -> None:
        self.any = "*" in allowed
        self.names = {"localhost"} | {h.lower().strip("[]") for h in listen_hosts} | {
            host_name(a) for a in allowed if a != "*"}

    def allows(self, header: str | None) -> bool:
        if self.any or header is None:  # HTTP/1.0 without Host: no browser sends that
            return True
        name = host_name(header)
        return name in self.names or name.endswith(".localhost") or _is_ip(name)


def is_json(content_type: str) -> bool:
    """`application/json`, with or without parameters (charset)."""
    return content_type.partition(";")[0].strip().lower() == "application/json"


class CorsPolicy:
    def __init__(self, origins: Iterable[str]) -> None:
        self.origins = {o.rstrip("/") for o in origins}
        self.enabled = bool(self.origins)

    def allows(self, origin: str | None) -> bool:
        return origin is not None and ("*" in self.origins or origin.rstrip("/") in self.origins)

    def headers(self, origin: str) -> dict[str, str]:
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
