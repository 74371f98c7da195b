"""Framing of the daemon ↔ runner channel: length-prefixed JSON objects."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from exod.wire.protocol import HEADER, MAX_FRAME, FrameDecoder, ProtocolError, encode

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


def test_json_nested_too_deeply_is_a_protocol_error_not_a_recursion_error() -> None:
    body = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(ProtocolError, match="nested too deeply"):
        FrameDecoder().feed(frame(body))


@pytest.mark.parametrize("value", [[1, 2], "text", 3, None, True], ids=str)
def test_a_frame_must_hold_an_object(value: object) -> None:
    with pytest.raises(ProtocolError, match="object"):
        FrameDecoder().feed(frame(json.dumps(value).encode()))
