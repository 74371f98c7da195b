"""The daemon fetches the pictures that requests name by an http(s) URL (exod.core.images.Source),
so that a request goes to the runner with every picture's bytes. Only bytes: the daemon never
decodes a picture (the runner does, exod.runner.vision.images).

A URL from a client must not reach what the daemon can reach and the client cannot (SSRF):
- an address that is not global unicast is refused by exod.core.addresses (the one rule of every
  fetch made for a client), whether the URL names it, a name resolves to it or a redirect leads
  there, unless the operator allows it (`api.image_url_allow`);
- the connection goes to the very addresses that were checked: the resolver that checks them is
  the one aiohttp connects through, with no DNS cache, so DNS rebinding has no second answer;
- redirects are followed here, a few at most, each checked as the first URL was;
- no proxy from the environment (it would connect where the check did not look).
A picture is capped in bytes and in time (the whole fetch, redirects included). Every failure
is a 400 naming the picture's part. docs/vision.md, "Pictures by URL".
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from exod.api.errors import ApiError, bad_request
from exod.api.request import GenRequest
from exod.core import images
from exod.core.addresses import Network, address_problem
from exod.core.images import Source
from exod.wire.messages import Image

MAX_REDIRECTS = 3
CHUNK = 64 * 1024


@dataclass(frozen=True)
class Policy:
    """What the operator allows (the `api.image_*` keys)."""

    enabled: bool = True
    timeout: float = 10.0
    allow: tuple[str, ...] = ()  # networks whose addresses may be fetched although private
    max_bytes: int = images.MAX_IMAGE_BYTES

    def networks(self) -> tuple[Network, ...]:
        return tuple(ipaddress.ip_network(n, strict=False) for n in self.allow)


class Unfit(Exception):
    """Why a picture's URL was not fetched (completes "the picture's URL ...")."""


class CheckedResolver(AbstractResolver):
    """The names' addresses, each checked: one that may not be fetched refuses the name."""

    def __init__(self, allow: tuple[Network, ...]) -> None:
        self.allow = allow
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        for entry in found:
            why = address_problem(entry["host"], self.allow)
            if why is not None:
                raise Unfit(f"names {host}, which resolves to {why}")
        return found

    async def close(self) -> None:
        await self._inner.close()


class Fetcher:
    """Fetches pictures for the API, on the daemon's loop; one client session for all."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.allow = policy.networks()
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(resolver=CheckedResolver(self.allow),
                                             use_dns_cache=False, limit=32)
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, auto_decompress=False,
                headers={"User-Agent": "exod", "Accept": "image/*"})
        return self._session

    async def resolve(self, req: GenRequest) -> GenRequest:
        """`req` with the bytes of every picture it names by URL (fetched together); a 400
        naming the first one that cannot be fetched."""
        wanted = [(n, s) for n, s in enumerate(req.pictures) if s.url is not None]
        if not wanted:
            return req
        if not self.policy.enabled:
            where = wanted[0][1].where
            raise bad_request(f"`{where}`: this server does not fetch pictures by URL "
                              "(api.image_urls is false): send the picture's bytes in base64",
                              where)
        got = await asyncio.gather(*(self._one(s) for _, s in wanted))
        fetched = dict(zip((n for n, _ in wanted), got, strict=True))
        pictures = tuple(replace(s, data=fetched[n], url=None) if n in fetched else s
                         for n, s in enumerate(req.pictures))
        gen = replace(req.gen, images=[Image(s.data or "") for s in pictures])
        return replace(req, gen=gen, pictures=pictures)

    async def _one(self, source: Source) -> str:
        assert source.url is not None
        try:
            async with asyncio.timeout(self.policy.timeout):
                raw = await self._get(source.url)
        except TimeoutError:
            why = f"did not give the whole picture within {self.policy.timeout:g}s " \
                  "(api.image_url_timeout)"
        except Unfit as e:
            why = str(e)
        except (aiohttp.ClientError, OSError, ValueError) as e:
            why = f"could not be fetched: {_reason(e)}"
        else:
            return base64.b64encode(raw).decode("ascii")
        raise ApiError(400, f"`{source.where}`: the picture's URL {why}", "invalid_request_error",
                       "image_url_unfit", source.where)

    async def _get(self, url: str) -> bytes:
        for _ in range(MAX_REDIRECTS + 1):
            self._check(url)
            async with self._client().get(url, allow_redirects=False) as resp:
                if resp.status in (301, 302, 303, 307, 308):
                    location = resp.headers.get("Location")
                    if not location:
                        raise Unfit(f"redirected ({resp.status}) without a Location")
                    url = urljoin(url, location)
                    continue
                if resp.status != 200:
                    raise Unfit(f"answered {resp.status} {resp.reason or ''}".rstrip())
                return await self._body(resp)
        raise Unfit(f"redirected more than {MAX_REDIRECTS} times")

    def _check(self, url: str) -> None:
        """The URL's scheme, and its host when it is an address (a name is checked as it is
        resolved, by CheckedResolver)."""
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise Unfit(f"leads to {url[:200]!r}, which is not an http(s) URL")
        host = parts.hostname
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return  # a name
        why = address_problem(host, self.allow)
        if why is not None:
            raise Unfit(f"names {why}")

    async def _body(self, resp: aiohttp.ClientResponse) -> bytes:
        cap = self.policy.max_bytes
        if resp.content_length is not None and resp.content_length > cap:
            raise Unfit(f"announces {resp.content_length} bytes, more than the {cap >> 20} MiB "
                        "a picture may have")
        out = bytearray()
        async for chunk in resp.content.iter_chunked(CHUNK):
            out += chunk
            if len(out) > cap:
                raise Unfit(f"gives more than the {cap >> 20} MiB a picture may have")
        if not out:
            raise Unfit("gave no bytes")
        return bytes(out)


def _reason(e: BaseException) -> str:
    cause: Any = e
    while isinstance(cause, aiohttp.ClientError) and cause.__cause__ is not None:
        cause = cause.__cause__
    if isinstance(cause, Unfit):
        return str(cause)
    return (str(cause).strip() or type(cause).__name__)[:200]
