"""The daemon's fetch of pictures named by URL (exod.api.image_fetch), against a real HTTP
server on a loopback address that the policy allows (127.0.0.2, as an operator allows a LAN
image server), while 127.0.0.1 stays refused: a picture comes back as its bytes, also from the
allowed address in its IPv4-mapped form; a URL to a loopback address, to an IPv4 address in IPv6
clothes (compatible, translated, NAT64, 6to4) or a site-local one, a name that resolves to one, a
redirect to one, too many redirects, too many bytes (announced or not), a 404 and a server that
never answers are each a 400 naming the part, within the time cap. In-process, real sockets;
~1 CPU-s. The address rule itself: tests/unit/test_addresses.py."""

from __future__ import annotations

import asyncio
import base64
import socket
import time
from typing import Any

import pytest
from aiohttp import web

from exod.api.errors import ApiError
from exod.api.image_fetch import Fetcher, Policy
from exod.api.dialects.openai.request import parse_chat
from exod.api.request import GenRequest
from exod.core import images

HOST = "127.0.0.2"
PICTURE = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8
CAP = 64 * 1024  # bytes a picture may have, here


async def serve() -> tuple[web.AppRunner, str]:
    hang = asyncio.Event()

    async def picture(request: web.Request) -> web.Response:
        return web.Response(body=PICTURE, content_type="image/png")

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    async def loop(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        raise web.HTTPFound(f"/loop/{n + 1}")

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * (CAP + 1))

    async def streamed(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()  # chunked: no Content-Length to refuse it by
        await resp.prepare(request)
        for _ in range(CAP // 1024 + 2):
            await resp.write(b"x" * 1024)
        return resp

    async def silent(request: web.Request) -> web.Response:
        await hang.wait()  # never answers
        return web.Response()

    app = web.Application()
    app.router.add_get("/cat.png", picture)
    app.router.add_get("/redirect", redirect)
    app.router.add_get("/loop/{n}", loop)
    app.router.add_get("/big", big)
    app.router.add_get("/streamed", streamed)
    app.router.add_get("/silent", silent)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://{HOST}:{port}"


def ask(*urls: str) -> GenRequest:
    parts: list[Any] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return parse_chat({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "look"}, *parts]}]})


@pytest.fixture
def fetcher() -> Fetcher:
    return Fetcher(Policy(timeout=1.5, allow=(f"{HOST}/32",), max_bytes=CAP))


async def outcomes(fetcher: Fetcher, urls: dict[str, str]) -> dict[str, tuple[float, Any]]:
    runner, base = await serve()
    try:
        async def one(path: str) -> tuple[float, Any]:
            t0 = time.monotonic()
            try:
                got: Any = await fetcher.resolve(ask(path.replace("BASE", base)))
            except ApiError as e:
                got = e
            return time.monotonic() - t0, got
        results = await asyncio.gather(*(one(u) for u in urls.values()))
        return dict(zip(urls, results, strict=True))
    finally:
        await fetcher.close()
        await runner.cleanup()


def test_a_picture_is_fetched_and_everything_unfit_is_a_400_naming_the_part(
        fetcher: Fetcher) -> None:
    cases = {
        "fetched": "BASE/cat.png",
        "loopback": "http://127.0.0.1:9/cat.png",
        "name of loopback": "http://localhost:9/cat.png",
        "decimal loopback": "http://2130706433:9/cat.png",
        "redirect to loopback": "BASE/redirect?to=http://127.0.0.1:9/x",
        "redirect to link-local": "BASE/redirect?to=http://169.254.169.254/latest",
        "redirect to a file": "BASE/redirect?to=file:///etc/passwd",
        "compatible loopback": "http://[::127.0.0.1]:9/cat.png",
        "translated loopback": "http://[::ffff:0:7f00:1]:9/cat.png",
        "NAT64 metadata": "http://[64:ff9b::a9fe:a9fe]/latest/meta-data",
        "local NAT64 metadata": "http://[64:ff9b:1::a9fe:a9fe]/latest/meta-data",
        "site-local": "http://[fec0::1]:9/cat.png",
        "redirect to NAT64 metadata": "BASE/redirect?to=http://[64:ff9b::a9fe:a9fe]/latest",
        "redirect to 6to4 loopback": "BASE/redirect?to=http://[2002:7f00:1::]:9/x",
        "redirect loop": "BASE/loop/0",
        "too big, announced": "BASE/big",
        "too big, streamed": "BASE/streamed",
        "missing": "BASE/nothing.png",
        "never answers": "BASE/silent",
    }
    got = asyncio.run(outcomes(fetcher, cases))
    seconds, fetched = got.pop("fetched")
    assert isinstance(fetched, GenRequest)
    assert base64.b64decode(fetched.gen.images[0].data) == PICTURE
    assert fetched.pictures[0].url is None and fetched.pictures[0].data
    expect = {"loopback": "loopback address", "name of loopback": "resolves to 127.0.0.1",
              "decimal loopback": "", "redirect to loopback": "loopback address",
              "redirect to link-local": "link-local address",
              "redirect to a file": "not an http(s) URL",
              "compatible loopback": "of 127.0.0.1, a loopback address",
              "translated loopback": "of 127.0.0.1, a loopback address",
              "NAT64 metadata": "of 169.254.169.254, a link-local address",
              "local NAT64 metadata": "of 169.254.169.254, a link-local address",
              "site-local": "fec0::1, a private or reserved address (fec0::/10, site-local",
              "redirect to NAT64 metadata": "of 169.254.169.254, a link-local address",
              "redirect to 6to4 loopback": "of 127.0.0.1, a loopback address",
              "redirect loop": "redirected more than", "too big, announced": "announces",
              "too big, streamed": "more than the", "missing": "answered 404",
              "never answers": "within 1.5s"}
    for what, (seconds, e) in got.items():
        assert isinstance(e, ApiError), (what, e)
        assert e.status == 400 and e.param == "messages[0].content[1]", (what, e.message)
        assert expect[what] in e.message, (what, e.message)
        assert seconds < 3.0, (what, seconds)


def test_several_pictures_of_a_request_are_fetched_together(fetcher: Fetcher) -> None:
    async def run() -> GenRequest:
        runner, base = await serve()
        try:
            return await fetcher.resolve(ask(f"data:image/png;base64,"
                                             f"{base64.b64encode(b'inline').decode()}",
                                             f"{base}/cat.png", f"{base}/cat.png"))
        finally:
            await fetcher.close()
            await runner.cleanup()
    req = asyncio.run(run())
    assert [base64.b64decode(i.data) for i in req.gen.images] == [b"inline", PICTURE, PICTURE]
    assert images.content_problem(req.gen.messages or [], 3) is None


def ipv6_sockets() -> bool:
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_sockets(), reason="no IPv6 sockets here")
def test_the_allowed_address_is_fetched_in_its_ipv4_mapped_form_too(fetcher: Fetcher) -> None:
    async def run() -> GenRequest:
        runner, base = await serve()
        try:
            return await fetcher.resolve(ask(base.replace(HOST, f"[::ffff:{HOST}]") + "/cat.png"))
        finally:
            await fetcher.close()
            await runner.cleanup()
    req = asyncio.run(run())
    assert base64.b64decode(req.gen.images[0].data) == PICTURE
