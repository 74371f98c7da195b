"""Test tools that play other programs on a cluster's LAN, run inside a test host's namespace:

    python -m tests.cluster_stranger announce ADDRESS PORT ID
        a stranger: registers `ID._exod._tcp.local.` by mDNS, as an exod would, and answers every
        exchange on PORT with an unsigned record (it holds no key); prints "ready" when both are up
    python -m tests.cluster_stranger send HOST PORT
        sends the one line read from stdin to HOST:PORT, prints the one line answered
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys

from exod.core.nodes import NodeInfo
from exod.daemon.cluster.mdns import SERVICE
from exod.wire.protocol import to_wire


async def announce(address: str, port: int, ident: str) -> None:
    from zeroconf import IPVersion
    from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

    record = {"record": {"cluster": "", "node": to_wire(NodeInfo(
        ident, "stranger", "cpu", 2**40, 2**40, 2**40, (), (address,), 0, port)),
        "time": 0.0, "nonce": "0", "links": [], "reply_to": ""}}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(json.dumps({"answer": record}).encode() + b"\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, address, port)
    zc = AsyncZeroconf(ip_version=IPVersion.V4Only)
    await zc.async_register_service(AsyncServiceInfo(
        SERVICE, f"{ident}.{SERVICE}", port=port, addresses=[socket.inet_aton(address)],
        properties={"id": ident, "v": "1"}, server=f"{ident}.local."))
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def send(host: str, port: int) -> None:
    line = sys.stdin.buffer.readline()
    with socket.create_connection((host, port), timeout=10) as s, s.makefile("rb") as f:
        s.sendall(line)
        sys.stdout.buffer.write(f.readline())


if __name__ == "__main__":
    if sys.argv[1] == "announce":
        asyncio.run(announce(sys.argv[2], int(sys.argv[3]), sys.argv[4]))
    else:
        send(sys.argv[2], int(sys.argv[3]))
