"""Pictures in every dialect, through the one field policy: chat completions' `image_url`
parts, Anthropic's `image` blocks, Responses' `input_image` parts become the same content parts
and `Generate.images` (exod.core.images), each picture named as the client placed it; what the
daemon may fetch (exod.api.image_fetch.address_problem). Pure: no sockets (the fetch itself:
tests/integration/test_image_fetch.py)."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
from typing import Any

import pytest

from exod.api.dialects.anthropic import request as anthropic
from exod.api.dialects.responses import request as responses
from exod.api.errors import ApiError
from exod.api.image_fetch import CheckedResolver, Fetcher, Policy, Unfit, address_problem
from exod.api.dialects.openai.request import parse_chat
from exod.api.request import GenRequest
from exod.api.seal import Sealer
from exod.core import images
from exod.core.request_rules import RequestError

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n-not-really").decode()
DATA = f"data:image/png;base64,{PNG}"
URL = "https://pictures.example/cat.png"
SEALER = Sealer(key=b"k" * 32)


def chat(*messages: Any, **body: Any) -> GenRequest:
    return parse_chat({"model": "m", "messages": list(messages), **body})


def claude(*messages: Any) -> GenRequest:
    return anthropic.parse({"model": "m", "max_tokens": 8, "messages": list(messages)},
                           SEALER)[0]


def resp(*items: Any) -> GenRequest:
    return responses.parse({"model": "m", "input": list(items)}, SEALER)[0]


def says(fn: Any, *args: Any) -> ApiError:
    with pytest.raises(ApiError) as e:
        fn(*args)
    assert e.value.status == 400
    return e.value


def shown(n: int) -> dict[str, Any]:
    return {"type": "image", "image": n}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


# ---- chat completions -----------------------------------------------------------------------
def test_chat_image_url_parts_data_and_http_in_several_turns() -> None:
    req = chat({"role": "user", "content": [
                   {"type": "text", "text": "Compare "},
                   {"type": "image_url", "image_url": {"url": DATA, "detail": "high"}},
                   {"type": "text", "text": "with "},
                   {"type": "image_url", "image_url": {"url": URL}}]},
               {"role": "assistant", "content": "Two cats."},
               {"role": "user", "content": [{"type": "image_url", "image_url": DATA},
                                            {"type": "text", "text": "and this?"}]})
    gen = req.gen
    assert gen.messages is not None
    assert gen.messages[0]["content"] == [text("Compare "), shown(0), text("with "), shown(1)]
    assert gen.messages[1]["content"] == "Two cats."
    assert gen.messages[2]["content"] == [shown(2), text("and this?")]
    assert [i.data for i in gen.images] == [PNG, "", PNG]  # the URL's: fetched later
    assert [(s.where, s.url) for s in req.pictures] == [
        ("messages[0].content[1]", None), ("messages[0].content[3]", URL),
        ("messages[2].content[0]", None)]
    assert gen.names == {}  # the client's places are the messages' own
    assert req.ignored == ()  # `detail` has no effect, and is no unknown field


@pytest.mark.parametrize("role", ["system", "developer", "assistant"])
def test_a_picture_belongs_to_a_user_message(role: str) -> None:
    e = says(chat, {"role": role, "content": [{"type": "image_url", "image_url": DATA}]})
    assert e.param == "messages[0].content[0]" and "user message" in e.message
    e = says(resp, {"role": role, "content": [{"type": "input_image", "image_url": DATA}]})
    assert e.param == "input[0].content[0]"


def test_chat_text_parts_alone_stay_joined_text() -> None:
    req = chat({"role": "user", "content": [text("a"), text("b")]})
    assert req.gen.messages == [{"role": "user", "content": "ab"}] and not req.pictures


@pytest.mark.parametrize("part, param", [
    ({"type": "image_url", "image_url": {"url": "ftp://x/y.png"}},
     "messages[0].content[0].image_url.url"),
    ({"type": "image_url", "image_url": {"url": "data:text/plain;base64,QQ=="}},
     "messages[0].content[0].image_url.url"),
    ({"type": "image_url", "image_url": {"url": "data:image/png,%89PNG"}},
     "messages[0].content[0].image_url.url"),
    ({"type": "image_url", "image_url": 3}, "messages[0].content[0].image_url"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,"}},
     "messages[0].content[0].image_url.url"),
    ({"type": "input_audio", "input_audio": {}}, "messages[0].content[0].type"),
])
def test_chat_a_picture_that_is_no_picture_is_refused_by_name(part: dict[str, Any],
                                                              param: str) -> None:
    assert says(chat, {"role": "user", "content": [part]}).param == param


def test_too_many_pictures_are_refused_at_the_one_too_many() -> None:
    parts = [{"type": "image_url", "image_url": {"url": DATA}}] * (images.MAX_IMAGES + 1)
    e = says(chat, {"role": "user", "content": parts})
    assert e.param == f"messages[0].content[{images.MAX_IMAGES}]"


# ---- Anthropic Messages ---------------------------------------------------------------------
def test_anthropic_image_blocks_base64_and_url_named_as_the_client_placed_them() -> None:
    req = claude({"role": "user", "content": [
                     {"type": "tool_result", "tool_use_id": "t", "content": "done"},
                     {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                  "data": PNG}},
                     {"type": "text", "text": "and"},
                     {"type": "image", "source": {"type": "url", "url": URL},
                      "cache_control": {"type": "ephemeral"}}]})
    gen = req.gen
    assert gen.messages == [{"role": "tool", "content": "done", "tool_call_id": "t"},
                            {"role": "user", "content": [shown(0), text("and"), shown(1)]}]
    assert [(s.where, s.data, s.url) for s in req.pictures] == [
        ("messages[0].content[1]", PNG, None), ("messages[0].content[3]", None, URL)]
    # The tool result moved the turn: the runner's errors name the client's blocks.
    assert gen.names["messages[1].content[0]"] == "messages[0].content[1]"
    assert gen.names["messages[1].content[2]"] == "messages[0].content[3]"


@pytest.mark.parametrize("message, param", [
    ({"role": "user", "content": [{"type": "image", "source": {"type": "file",
                                                              "file_id": "f"}}]},
     "messages[0].content[0].source.type"),
    ({"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]},
     "messages[0].content[0].source.data"),
    ({"role": "user", "content": [{"type": "image", "source": {"type": "base64",
                                                              "data": PNG, "x": 1}}]},
     None),  # an unknown key: ignored, reported
    ({"role": "assistant", "content": [{"type": "image", "source": {"type": "url",
                                                                   "url": URL}}]},
     "messages[0].content[0].type"),
    ({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "image", "source": {"type": "url", "url": URL}}]}]},
     "messages[0].content[0].content[0].type"),
])
def test_anthropic_pictures_that_cannot_be_taken_are_refused_by_name(
        message: dict[str, Any], param: str | None) -> None:
    if param is None:
        assert claude(message).ignored == ("messages[].content[].source.x",)
    else:
        assert says(claude, message).param == param


# ---- OpenAI Responses -----------------------------------------------------------------------
def test_responses_input_image_parts() -> None:
    req = resp({"role": "system", "content": "Be brief."},
               {"role": "user", "content": [
                   {"type": "input_image", "image_url": URL, "detail": "auto"},
                   {"type": "input_text", "text": "what is it?"}]})
    assert req.gen.messages is not None
    assert req.gen.messages[1]["content"] == [shown(0), text("what is it?")]
    assert [(s.where, s.url) for s in req.pictures] == [("input[1].content[0]", URL)]
    assert req.gen.names["messages[1].content[0]"] == "input[1].content[0]"


@pytest.mark.parametrize("item, param", [
    ({"role": "user", "content": [{"type": "input_image", "file_id": "f"}]},
     "input[0].content[0].file_id"),
    ({"role": "user", "content": [{"type": "input_image", "image_url": "cat.png"}]},
     "input[0].content[0].image_url"),
    ({"type": "function_call_output", "call_id": "c", "output": [
        {"type": "input_image", "image_url": URL}]}, "input[0].output[0].type"),
])
def test_responses_pictures_that_cannot_be_taken_are_refused_by_name(
        item: dict[str, Any], param: str) -> None:
    assert says(resp, item).param == param


# ---- what the daemon may fetch --------------------------------------------------------------
@pytest.mark.parametrize("address, refused", [
    ("93.184.215.14", None), ("2606:4700::1111", None),
    ("127.0.0.1", "loopback"), ("127.9.9.9", "loopback"), ("::1", "loopback"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"),
    ("100.64.0.1", "private"), ("0.0.0.0", "private"), ("fd00::1", "private"),
    ("169.254.169.254", "link-local"), ("fe80::1%eth0", "link-local"),
    ("224.0.0.1", "multicast"), ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:10.0.0.1", "private"), ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
    ("not-an-address", "not an IP address"),
])
def test_only_public_addresses_may_be_fetched(address: str, refused: str | None) -> None:
    why = address_problem(address)
    assert (why is None) if refused is None else (why is not None and refused in why), why


def test_an_operator_may_allow_a_private_network() -> None:
    allow = (ipaddress.ip_network("10.1.2.0/24"),)
    assert address_problem("10.1.2.3", allow) is None
    assert address_problem("10.1.3.3", allow) is not None


class Answers:
    """A resolver that answers what it is told (the inner resolver of CheckedResolver)."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = addresses

    async def resolve(self, host: str, port: int = 0, family: Any = 0) -> list[Any]:
        return [{"hostname": host, "host": a, "port": port, "family": family, "proto": 0,
                 "flags": 0} for a in self.addresses]

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("addresses, refused", [
    (("93.184.215.14",), False), (("93.184.215.14", "10.0.0.1"), True), (("::1",), True)])
def test_a_name_is_refused_when_any_of_its_addresses_is(addresses: tuple[str, ...],
                                                        refused: bool) -> None:
    async def run() -> None:
        resolver = CheckedResolver(())
        resolver._inner = Answers(*addresses)  # type: ignore[assignment]
        if refused:
            with pytest.raises(Unfit, match="resolves to"):
                await resolver.resolve("pictures.example", 443)
        else:
            assert len(await resolver.resolve("pictures.example", 443)) == 1
    asyncio.run(run())


def test_urls_switched_off_are_refused_naming_the_part() -> None:
    req = chat({"role": "user", "content": [{"type": "image_url", "image_url": {"url": DATA}},
                                            {"type": "image_url", "image_url": {"url": URL}}]})
    fetcher = Fetcher(Policy(enabled=False))
    e = says(lambda: asyncio.run(fetcher.resolve(req)))
    assert e.param == "messages[0].content[1]" and "api.image_urls" in e.message
    only_data = chat({"role": "user", "content": [{"type": "image_url",
                                                   "image_url": {"url": DATA}}]})
    assert asyncio.run(fetcher.resolve(only_data)) is only_data  # nothing to fetch


def test_the_core_wording_names_the_part() -> None:
    with pytest.raises(RequestError) as e:
        images.image_url(3, "messages[0].content[0].image_url")
    assert e.value.param == "messages[0].content[0].image_url"
    assert images.unseen("m", "messages[0].content[0]") == \
        "`messages[0].content[0]`: model 'm' does not see images: it takes text only"
