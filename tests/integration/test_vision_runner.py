"""The real runner process (`python -m exod.runner`) on a model that sees, over its channel as
the daemon speaks it: it loads the model through mlx-vlm with progress (a step per block of the
vision tower and of the language model), says
ready, and answers a request with a picture with in-process mlx-vlm's text, while a text request
runs beside it and hostile pictures (a 100-megapixel PNG, a truncated JPEG, a decompression
bomb) are each refused within seconds as a bad request naming the part. The API's image fields
are not wired yet (issue 31's field policy): this speaks the runner's wire directly.
~6 CPU-s: a runner (imports ~3 s) and one mlx-vlm reference process."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from exod.wire import messages as m
from exod.config.schema import Instance
from exod.core.shards import Shard
from exod.daemon.launch import Launcher
from exod.wire.protocol import FrameDecoder, encode
from tests.harness import REPO, SAFETY
from tests.unit.test_vision_images import HOSTILE

PROMPT = "What is in the picture?"
FAMILY = "qwen2_5_vl"


def reference(zoo: Path) -> dict[str, Any]:
    """mlx-vlm's greedy answer (8 tokens) to one test picture then PROMPT, in a subprocess."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.models.vision_zoo", str(zoo), FAMILY, "--prompt", PROMPT],
        cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
        timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])[FAMILY]
    return got


def picture_png() -> str:
    """tests.models.vision_zoo.picture(seed=0) as PNG, base64 (made here without numpy)."""
    code = ("import base64, io, sys; from tests.models.vision_zoo import picture; b = io.BytesIO();"
            " picture(seed=0).save(b, 'PNG'); sys.stdout.write(base64.b64encode(b.getvalue())"
            ".decode())")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, check=True, timeout=120).stdout


def chat(rid: str, image: str | None, max_tokens: int = 8) -> m.Generate:
    content: Any = [{"type": "image", "image": 0}, {"type": "text", "text": PROMPT}] \
        if image is not None else PROMPT
    return m.Generate(id=rid, kind="chat", max_tokens=max_tokens, temperature=0.0,
                      images=[m.Image(image)] if image is not None else [],
                      messages=[{"role": "user", "content": content}])


class Wire:
    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.decoder = sock, FrameDecoder()
        sock.settimeout(SAFETY)

    def send(self, msg: m.Message) -> None:
        self.sock.sendall(encode(m.to_wire(msg)))

    def read(self) -> list[m.FromRunner]:
        data = self.sock.recv(1 << 16)
        assert data, "the runner closed its channel"
        return [m.decode_from_runner(f) for f in self.decoder.feed(data)]


def test_the_runner_serves_a_picture_as_mlx_vlm_does(vision_zoo: Path) -> None:
    want = reference(vision_zoo)
    image = picture_png()
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "exod.runner", "--channel-fd", str(theirs.fileno())],
        pass_fds=(theirs.fileno(),), cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    theirs.close()
    wire = Wire(ours)
    try:
        got: list[m.FromRunner] = wire.read()  # its hello; then its spec, as the daemon sends it
        wire.sock.sendall(encode(m.to_wire(Launcher(vision_zoo, {}).launch(
            Instance(name="v", model=vision_zoo / FAMILY), Shard(0, 1, 0, 0, 0), 1, 4).spec)))
        while not any(isinstance(x, (m.Ready, m.Failed)) for x in got):
            got += wire.read()
        assert not any(isinstance(x, m.Failed) for x in got), got
        progress = [x for x in got if isinstance(x, m.LoadProgress)]
        # The tower's 2 blocks, then the language model's 4, a step each.
        assert [(p.loaded, p.total) for p in progress] == [(i, 6) for i in range(7)]
        wire.send(chat("seen", image))
        wire.send(chat("text", None, max_tokens=16))
        hostile = [(what, base64.b64encode(make()).decode()) for what, make, _ in HOSTILE[:3]]
        sent = time.monotonic()
        for what, data in hostile:
            wire.send(chat(what, data))
        ends: dict[str, tuple[float, m.FromRunner]] = {}
        texts: dict[str, str] = {}
        while len(ends) < 2 + len(hostile):
            for x in wire.read():
                if isinstance(x, m.Text):
                    texts[x.id] = texts.get(x.id, "") + x.text
                elif isinstance(x, (m.Done, m.Error)):
                    ends[x.id] = (time.monotonic() - sent, x)
        wire.send(m.Shutdown(drain=1.0))
        assert proc.wait(SAFETY) == 0
    finally:
        proc.kill()
        ours.close()
    seen = ends["seen"][1]
    assert isinstance(seen, m.Done), seen
    assert (seen.prompt_tokens, seen.completion_tokens) == (want["prompt_tokens"], 8)
    assert texts.get("seen", "") == want["text"]
    assert isinstance(ends["text"][1], m.Done)
    for what, _ in hostile:
        seconds, end = ends[what]
        assert isinstance(end, m.Error) and end.code == "bad_request", end
        assert end.param == "messages[0].content[0]", end
        assert seconds < 10, (what, seconds)
