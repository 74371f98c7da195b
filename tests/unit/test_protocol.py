"""The two wire formats: length-prefixed JSON (daemon ↔ runner channel) and sd_notify lines."""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

import pytest

from exod.daemon.notify_server import parse
from exod.protocol import HEADER, MAX_FRAME, FrameDecoder, ProtocolError, encode, recv_blocking

MESSAGES: list[dict[str, Any]] = [
    {},
    {"op": "shutdown", "drain": 5.0},
    {"nested": {"list": [1, 2.5, None, True, "x"]}, "n": -3},
    {"text": "héllo wörld — ✓ 漢字 🙂", "emoji": "🚀"},
    {"big": "x" * 100_000},
]


def frame(body: bytes) -> bytes:
    return struct.pack("!I", len(body)) + body


# ---- framing -------------------------------------------------------------------------------
@pytest.mark.parametrize("msg", MESSAGES, ids=range(len(MESSAGES)))
def test_round_trip(msg: dict[str, Any]) -> None:
    assert FrameDecoder().feed(encode(msg)) == [msg]


def test_encoding_is_a_big_endian_length_then_utf8_json() -> None:
    data = encode({"a": "é"})
    body = '{"a":"é"}'.encode()
    assert data == b"\x00\x00\x00" + bytes([len(body)]) + body
    assert HEADER.size == 4


@pytest.mark.parametrize("msg", MESSAGES[1:4], ids=range(3))
def test_byte_by_byte(msg: dict[str, Any]) -> None:
    data = encode(msg)
    dec = FrameDecoder()
    for b in data[:-1]:
        assert dec.feed(bytes([b])) == []
    assert dec.feed(data[-1:]) == [msg]
    assert dec.feed(b"") == []


def test_several_frames_in_one_chunk() -> None:
    data = b"".join(encode(m) for m in MESSAGES)
    assert FrameDecoder().feed(data) == MESSAGES


def test_every_split_point_of_two_frames() -> None:
    a, b = {"op": "a", "t": "ü"}, {"op": "b", "n": [1, 2]}
    data = encode(a) + encode(b)
    for i in range(len(data) + 1):
        dec = FrameDecoder()
        assert dec.feed(data[:i]) + dec.feed(data[i:]) == [a, b], i


def test_partial_frame_stays_buffered_after_whole_ones() -> None:
    dec = FrameDecoder()
    tail = encode({"second": 2})
    assert dec.feed(encode({"first": 1}) + tail[:5]) == [{"first": 1}]
    assert dec.feed(tail[5:]) == [{"second": 2}]


def test_oversize_length_is_refused_before_the_body_arrives() -> None:
    with pytest.raises(ProtocolError, match="exceeds"):
        FrameDecoder().feed(struct.pack("!I", MAX_FRAME + 1))
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(b"\xff\xff\xff\xff")
    # exactly the limit is a legal length: the decoder just waits for the body
    assert FrameDecoder().feed(struct.pack("!I", MAX_FRAME) + b"{") == []


@pytest.mark.parametrize("body", [
    b"{not json", b"", b"{\"a\": 1", b"\xff\xfe{}", b"{\"a\": \"\xc3\x28\"}",
], ids=["garbage", "empty", "truncated", "bad-bom", "invalid-utf8"])
def test_bad_json_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(frame(body))


@pytest.mark.parametrize("value", [[1, 2], "text", 3, None, True], ids=str)
def test_a_frame_must_hold_an_object(value: object) -> None:
    with pytest.raises(ProtocolError, match="object"):
        FrameDecoder().feed(frame(json.dumps(value).encode()))


def test_recv_blocking_over_a_socket_pair() -> None:
    a, b = socket.socketpair()
    with a, b:
        dec = FrameDecoder()
        a.sendall(encode({"op": "ping"}) + encode({"op": "pong"}))
        got: list[dict[str, Any]] = []
        while len(got) < 2:
            msgs = recv_blocking(b, dec)
            assert msgs is not None
            got += msgs
        assert got == [{"op": "ping"}, {"op": "pong"}]
        a.shutdown(socket.SHUT_WR)
        assert recv_blocking(b, dec) is None


# ---- sd_notify datagrams ---------------------------------------------------------------------
@pytest.mark.parametrize(("data", "expected"), [
    (b"READY=1", {"READY": "1"}),
    (b"READY=1\nSTATUS=loading 3/28\nX_EXOD_LAYERS=3/28\n",
     {"READY": "1", "STATUS": "loading 3/28", "X_EXOD_LAYERS": "3/28"}),
    (b"", {}),
    (b"\n\n", {}),
    (b"BARRIER", {}),  # no '=': ignored
    (b"junk\nREADY=1\n=orphan value\n", {"READY": "1"}),  # no key: ignored
    (b"STATUS=a\nSTATUS=b", {"STATUS": "b"}),  # last key wins
    (b"STATUS=", {"STATUS": ""}),
    (b"X_EXOD_ERROR=shape mismatch: a=1 b=2", {"X_EXOD_ERROR": "shape mismatch: a=1 b=2"}),
    ("STATUS=chargement ✓ 漢字".encode(), {"STATUS": "chargement ✓ 漢字"}),
    (b"STATUS=bad \xff byte\nREADY=1", {"STATUS": "bad \ufffd byte", "READY": "1"}),
], ids=["one", "multi", "empty", "blank-lines", "no-equals", "no-key", "last-wins",
        "empty-value", "equals-in-value", "utf8", "invalid-utf8"])
def test_notify_parse(data: bytes, expected: dict[str, str]) -> None:
    assert parse(data) == expected
