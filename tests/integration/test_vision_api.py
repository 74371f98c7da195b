"""Models that see, end to end through the HTTP API: a real daemon, a real vision runner on the
vision zoo's Qwen2.5-VL, and the official clients (`openai` for chat completions and Responses,
`anthropic` for Messages). A picture, sent as bytes or as a URL the daemon fetches (from a
server on 127.0.0.2, a network this daemon's operator allows), gets in-process mlx-vlm's answer
in every dialect; a second turn about it starts from the prompt cache; a text model refuses a
picture naming its part; hostile pictures (a 100-megapixel PNG, a decompression bomb, a
truncated JPEG, a URL to 127.0.0.1, a URL that never answers) are each a 400 within seconds
while a stream goes on at its pace. One daemon serves the module: ~25 CPU-s (two runners'
imports and loads, a reference mlx-vlm process, ~40 short generations).
"""

from __future__ import annotations

import base64
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.harness import Daemon
from tests.integration.test_api import TOKEN, Served
from tests.integration.test_vision_runner import FAMILY, PROMPT, picture_png, reference
from tests.unit.test_vision_images import HOSTILE
from tests.usage import prompt_of

PICTURES = "127.0.0.2"  # the picture server: allowed by api.image_url_allow
N = 8


class Pictures(http.server.ThreadingHTTPServer):
    """Serves /cat.png (the test picture) and /silent (never answers)."""

    daemon_threads = True

    def __init__(self, png: bytes) -> None:
        self.png, self.release = png, threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                if self.path == "/silent":
                    server.release.wait(60)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(server.png)))
                self.end_headers()
                self.wfile.write(server.png)

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__((PICTURES, 0), Handler)
        self.url = f"http://{PICTURES}:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()


class Seeing(Served):
    def __init__(self, daemon: Daemon, model: Path, png: str, want: dict[str, Any],
                 pictures: Pictures) -> None:
        super().__init__(daemon, model)
        self.png, self.want, self.pictures = png, want, pictures
        self.claude = anthropic.Anthropic(base_url=self.url, api_key=TOKEN, max_retries=0,
                                          timeout=60)

    def ask(self, url: str, model: str = "eye", **kw: Any) -> Any:
        return self.client.chat.completions.create(
            model=model, max_tokens=N, temperature=0, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": PROMPT}]}], **kw)  # type: ignore[list-item]

    @property
    def data_url(self) -> str:
        return f"data:image/png;base64,{self.png}"


@pytest.fixture(scope="module")
def seeing(vision_zoo: Path, tiny_model: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeing]:
    tmp = tmp_path_factory.mktemp("vision-api")
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)  # a secret: closed to other users
    want = reference(vision_zoo)
    png = picture_png()
    pictures = Pictures(base64.b64decode(png))
    d = Daemon({"api": {"listen": "127.0.0.1:0", "token_file": str(token_file),
                        "image_url_allow": [f"{PICTURES}/32"], "image_url_timeout": "2s"},
                "instances": {"eye": {"model": str(vision_zoo / FAMILY), "max_concurrency": 4},
                              "blind": {"model": str(tiny_model), "max_concurrency": 1}}})
    try:
        d.start()
        d.watch_until(lambda s: all(i["state"] == "ready" for i in s["instances"]),
                      what="every instance ready")
        yield Seeing(d, vision_zoo / FAMILY, png, want, pictures)
    finally:
        d.close()
        pictures.close()


def test_a_picture_as_bytes_or_url_gets_mlx_vlm_s_answer_in_chat_completions(
        seeing: Seeing) -> None:
    for url in (seeing.data_url, f"{seeing.pictures.url}/cat.png"):
        r = seeing.ask(url)
        assert r.choices[0].message.content == seeing.want["text"], url
        assert r.usage is not None and r.usage.prompt_tokens == seeing.want["prompt_tokens"]


def test_anthropic_image_blocks_base64_and_url(seeing: Seeing) -> None:
    for source in ({"type": "base64", "media_type": "image/png", "data": seeing.png},
                   {"type": "url", "url": f"{seeing.pictures.url}/cat.png"}):
        r = seeing.claude.messages.create(
            model="eye", max_tokens=N, extra_body={"temperature": 0},
            messages=[{"role": "user", "content": [
                {"type": "image", "source": source},  # type: ignore[misc,list-item]
                {"type": "text", "text": PROMPT}]}])
        text = "".join(b.text for b in r.content if b.type == "text")
        assert text == seeing.want["text"], source["type"]
        assert prompt_of(r.usage) == seeing.want["prompt_tokens"]


def test_responses_input_image(seeing: Seeing) -> None:
    r = seeing.client.responses.create(
        model="eye", max_output_tokens=N, temperature=0, store=False, input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": seeing.data_url,
                                          "detail": "auto"},
                                         {"type": "input_text", "text": PROMPT}]}])
    assert r.output_text == seeing.want["text"]


def test_several_pictures_and_earlier_turns_read_alike_in_every_dialect(seeing: Seeing) -> None:
    """Two pictures in a message, after an earlier turn that showed one: the three dialects
    give the model the same prompt and so the same answer, every picture in it."""
    second = f"{seeing.pictures.url}/cat.png"
    earlier, answer, now = "Look at this.", "I see it.", "And these two?"
    def ask_chat(*shown: str) -> Any:
        return seeing.client.chat.completions.create(
            model="eye", max_tokens=N, temperature=0, messages=[  # type: ignore[misc,list-item]
                {"role": "user", "content": [*({"type": "image_url", "image_url": {"url": u}}
                                               for u in shown[:-2]),
                                             {"type": "text", "text": earlier}]},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": [
                    *({"type": "image_url", "image_url": {"url": u}} for u in shown[-2:]),
                    {"type": "text", "text": now}]}])
    chat = ask_chat(second, seeing.data_url, second)
    b64 = {"type": "base64", "media_type": "image/png", "data": seeing.png}
    url = {"type": "url", "url": second}
    claude = seeing.claude.messages.create(
        model="eye", max_tokens=N, extra_body={"temperature": 0}, messages=[
            {"role": "user", "content": [{"type": "image", "source": url},  # type: ignore[list-item,misc]
                                         {"type": "text", "text": earlier}]},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": [{"type": "image", "source": b64},  # type: ignore[list-item,misc]
                                         {"type": "image", "source": url},
                                         {"type": "text", "text": now}]}])
    responses = seeing.client.responses.create(
        model="eye", max_output_tokens=N, temperature=0, store=False, input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": second,
                                          "detail": "auto"},
                                         {"type": "input_text", "text": earlier}]},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": [
                {"type": "input_image", "image_url": seeing.data_url, "detail": "auto"},
                {"type": "input_image", "image_url": second, "detail": "auto"},
                {"type": "input_text", "text": now}]}])
    assert chat.usage is not None and responses.usage is not None
    text = chat.choices[0].message.content
    assert "".join(b.text for b in claude.content if b.type == "text") == text
    assert responses.output_text == text
    prompt = chat.usage.prompt_tokens
    assert prompt_of(claude.usage) == responses.usage.input_tokens == prompt
    fewer = ask_chat(seeing.data_url, second)  # the earlier turn without its picture
    assert fewer.usage is not None
    assert prompt > fewer.usage.prompt_tokens > seeing.want["prompt_tokens"]


def test_the_next_turn_about_the_same_picture_starts_from_the_cache(seeing: Seeing) -> None:
    first = seeing.ask(seeing.data_url)
    answer = first.choices[0].message.content or ""
    turns: list[Any] = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": seeing.data_url}},
                                     {"type": "text", "text": PROMPT}]},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And its colour?"}]
    r = seeing.client.chat.completions.create(model="eye", max_tokens=N, temperature=0,
                                              messages=turns)
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1 > 0  # type: ignore[union-attr]
    seeing.d.until_instance("eye", lambda i: (((i.get("serving") or {}).get("prompt_cache")
                                               or {}).get("hits") or 0) >= 1)


def test_logprobs_and_a_text_request_beside_pictures(seeing: Seeing) -> None:
    r = seeing.ask(seeing.data_url, logprobs=True, top_logprobs=2)
    assert r.choices[0].message.content == seeing.want["text"]
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == N
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
    text = seeing.client.chat.completions.create(
        model="eye", max_tokens=N, temperature=0,
        messages=[{"role": "user", "content": PROMPT}])
    assert text.usage is not None and text.usage.completion_tokens == N


def test_the_models_say_which_one_sees(seeing: Seeing) -> None:
    models = {m.id: m for m in seeing.client.models.list().data}
    eye, blind = (models[n].model_dump() for n in ("eye", "blind"))
    assert eye["capabilities"]["vision"] == {"supported": True}
    assert eye["capabilities"]["image_input"] == {"supported": True}
    assert eye["architecture"]["input_modalities"] == ["text", "image"]
    assert blind["capabilities"]["vision"] == {"supported": False}


def test_a_model_that_does_not_see_refuses_a_picture_naming_it(seeing: Seeing) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        seeing.ask(seeing.data_url, model="blind")
    assert e.value.body["param"] == "messages[0].content[0]"  # type: ignore[index]
    assert "does not see images" in e.value.message
    with pytest.raises(anthropic.BadRequestError) as a:
        seeing.claude.messages.create(model="blind", max_tokens=N, messages=[
            {"role": "user", "content": [{"type": "text", "text": "look"}, {
                "type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": seeing.png}}]}])
    assert "messages[0].content[1]" in a.value.message


def test_hostile_pictures_are_each_a_400_within_seconds_while_a_stream_goes_on(
        seeing: Seeing) -> None:
    hostile = {what: f"data:image/png;base64,{base64.b64encode(make()).decode()}"
               for what, make, _ in HOSTILE[:2] + HOSTILE[3:4]}
    hostile["a URL to 127.0.0.1"] = "http://127.0.0.1:9/cat.png"
    hostile["a URL that never answers"] = f"{seeing.pictures.url}/silent"
    gaps: list[float] = []
    streamed = threading.Event()

    def stream() -> None:
        last = None
        for chunk in seeing.client.chat.completions.create(
                model="eye", max_tokens=48, temperature=0, stream=True,
                messages=[{"role": "user", "content": PROMPT}]):
            now = time.monotonic()
            if last is not None and chunk.choices:
                gaps.append(now - last)
            last = now
            streamed.set()

    streaming = threading.Thread(target=stream)
    streaming.start()
    assert streamed.wait(60)
    answers: dict[str, tuple[float, Any]] = {}

    def refuse(what: str, url: str) -> None:
        t0 = time.monotonic()
        try:
            seeing.ask(url)
            answers[what] = (time.monotonic() - t0, None)
        except openai.BadRequestError as e:
            answers[what] = (time.monotonic() - t0, e)

    askers = [threading.Thread(target=refuse, args=item) for item in hostile.items()]
    for t in askers:
        t.start()
    for t in askers:
        t.join(60)
    streaming.join(120)
    assert sorted(answers) == sorted(hostile)
    for what, (seconds, error) in answers.items():
        assert error is not None, f"{what} was answered"
        assert error.body["param"] == "messages[0].content[0]", (what, error.body)  # type: ignore[index]
        assert seconds < 5.0, (what, seconds)
    assert len(gaps) >= 40 and max(gaps) < 2.0, max(gaps)
