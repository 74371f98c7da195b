"""Issue 45's picture bomb, through the HTTP API to the vision zoo's Qwen2.5-VL: eight, then
sixteen, 1-bit PNGs of 7071x7071 (6 KB each, just under the 50 megapixels a picture may have)
in one chat request (a 64 KiB and a 129 KiB body). It used to be a 200 after 8-28 s, the
runner 3.0 GB larger at its peak and 1.4 GB larger for good.

- With the default budget (api.max_request_megapixels: 100), each is a 400 within a second,
  naming every picture with its size, and the runner never sees it.
- With the budget raised to take them (800), each is a 200, the pictures decoded at the
  model's resolution (112x112 here): the runner's RSS grows by less than 400 MB while it
  serves one, and comes back within 100 MB of where it was.

Two daemons, one vision runner each: ~15 CPU-s.
"""

from __future__ import annotations

import base64
import functools
import io
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from PIL import Image

from tests.harness import Daemon
from tests.integration.test_vision_runner import FAMILY, PROMPT

MB = 1_000_000


def bomb(seed: int) -> str:
    """A data URL of a 1-bit 7071x7071 PNG (one pixel set by `seed`: each picture its own)."""
    img = Image.new("1", (7071, 7071), 0)
    img.putpixel((seed, seed), 1)
    buf = io.BytesIO()
    img.save(buf, "PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def bombs() -> list[str]:
    return [bomb(i) for i in range(16)]


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


class Eye:
    """A daemon serving the zoo's Qwen2.5-VL as `eye`, and its vision runner's pid."""

    def __init__(self, vision_zoo: Path, api: dict[str, Any]) -> None:
        self.d = Daemon({"api": {"listen": "127.0.0.1:0", **api}, "instances": {
            "eye": {"model": str(vision_zoo / FAMILY), "max_concurrency": 2}}})
        self.d.start()
        inst = self.d.watch_until(lambda s: s["instances"][0]["state"] == "ready",
                                  what="eye ready")["instances"][0]
        self.pid = int(inst["ranks"][0]["pid"])
        self.client = openai.OpenAI(base_url=self.d.api_url() + "/v1", api_key="-",
                                    max_retries=0, timeout=120)

    def ask(self, urls: list[str]) -> Any:
        return self.client.chat.completions.create(
            model="eye", max_tokens=4, temperature=0,
            messages=[{"role": "user", "content": [  # type: ignore[list-item,misc]
                *({"type": "image_url", "image_url": {"url": u}} for u in urls),
                {"type": "text", "text": PROMPT}]}])


@pytest.fixture
def eye(request: pytest.FixtureRequest, vision_zoo: Path) -> Iterator[Eye]:
    served = Eye(vision_zoo, request.param)
    try:
        yield served
    finally:
        served.d.close()


@pytest.mark.parametrize("eye", [{}], indirect=True)
def test_the_bombs_are_a_400_within_a_second_naming_each_picture(eye: Eye,
                                                                 bombs: list[str]) -> None:
    before = rss(eye.pid)
    for n in (8, 16):
        t0 = time.monotonic()
        with pytest.raises(openai.BadRequestError) as e:
            eye.ask(bombs[:n])
        assert time.monotonic() - t0 < 1.0, n
        body: Any = e.value.body
        assert body["param"] == "messages[0].content[2]"  # the third passes 100 megapixels
        assert body["code"] == "image_too_large"
        message = body["message"]
        assert all(f"`messages[0].content[{i}]` 7071x7071" in message for i in range(n))
        assert f"{n * 7071 * 7071 / MB:.1f} megapixels in all, more than the 100" in message
    assert rss(eye.pid) - before < 10 * MB  # the runner never saw them


@pytest.mark.parametrize("eye", [{"max_request_megapixels": 800}], indirect=True)
def test_the_bombs_are_served_at_the_model_s_resolution_and_the_runner_gives_memory_back(
        eye: Eye, bombs: list[str]) -> None:
    small = Image.new("RGB", (64, 48), (10, 200, 30))
    buf = io.BytesIO()
    small.save(buf, "PNG")
    warm = eye.ask(["data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()])
    assert warm.usage is not None
    for n in (8, 16):
        before = rss(eye.pid)
        r, peak = peak_rss(eye.pid, functools.partial(eye.ask, bombs[:n]))
        assert r.choices[0].finish_reason == "length" and r.usage is not None
        # Each picture is 113x113 once decoded; the processor makes 112x112 of it, as it made
        # of the whole: 16 tokens (patches of 14, merged 2x2).
        assert r.usage.prompt_tokens > n * 16 > warm.usage.prompt_tokens
        assert peak - before < 400 * MB, (n, (peak - before) / MB)
        assert rss(eye.pid) - before < 100 * MB, (n, (rss(eye.pid) - before) / MB)


def peak_rss(pid: int, call: Callable[[], Any]) -> tuple[Any, int]:
    """What `call` returns, and the largest RSS of `pid` seen meanwhile (every 10 ms)."""
    peak, done = [rss(pid)], threading.Event()

    def watch() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], rss(pid))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        return call(), max(peak[0], rss(pid))
    finally:
        done.set()
        watcher.join()
