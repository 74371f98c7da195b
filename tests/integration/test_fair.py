"""Fair shares of the batch through a daemon, on 1 rank and in a 2-rank pipeline (every rank
decides the same from the same admissions and steps: exod.runner.serving.fair_share). Named
keys: a nightly job's (`priority: batch`) stream fills the batch of one row when a person's
chat comes; the job is held back between steps, the chat is answered while the job's stream is
still under way, and both answers are what in-process mlx-lm answers each alone. Requests past
the width wait in the runner's engine, and the queue's bound still answers 429. Real runners,
the official openai client. In process (whom a full batch starts, held back in a prompt, the
zoo): test_fair_engine.py; the figures: `python -m bench fair`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from exod.core.keys import hash_text
from tests.harness import Daemon
from tests.integration.test_group_serving import EOS

MLX_LM = """
import json, sys
from mlx_lm import generate, load
from mlx_lm.sample_utils import make_logits_processors
model, tok = load(sys.argv[1])
ban = make_logits_processors(logit_bias={EOS: -100.0})
out = []
for q, n in json.loads(sys.argv[2]):
    prompt = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
    out.append(generate(model, tok, prompt, max_tokens=n, logits_processors=ban))
print(json.dumps(out))
""".replace("EOS", str(EOS))
NIGHT = ("Summarise the logs of the night.", 160)
DAY = ("Name a colour.", 24)


def mlx_lm_greedy(model: Path, asks: list[tuple[str, int]]) -> list[str]:
    """In-process mlx-lm's greedy text (in a subprocess: the test process never imports mlx)."""
    out = subprocess.run([sys.executable, "-c", MLX_LM, str(model), json.dumps(asks)],
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    texts: list[str] = json.loads(out.strip().splitlines()[-1])
    return texts


@pytest.mark.parametrize("layout", ["one", "pipeline"])
def test_a_nightly_job_is_held_back_for_a_persons_chat_with_both_their_own_tokens(
        daemons: Callable[..., Daemon], tiny_model_factory: Callable[..., Path],
        layout: str) -> None:
    model = tiny_model_factory(layers=6)
    split = {} if layout == "one" else {"shards": 2, "parallelism": "pipeline"}
    d = daemons({"api": {"listen": "127.0.0.1:0", "keys": [
        {"name": "day", "hash": hash_text("day-secret")},
        {"name": "night", "hash": hash_text("night-secret"), "priority": "batch"}]},
        "instances": {"g": {"model": str(model), "max_concurrency": 1, "max_queue": 2,
                            **split}}})
    d.start()
    d.until_instance("g", lambda i: i["state"] == "ready" and i["serving"] is not None,
                     what="the instance ready, with its engine's figures")

    def client(secret: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=d.api_url() + "/v1", api_key=secret, max_retries=0,
                             timeout=120)

    def chat(c: openai.OpenAI, ask: tuple[str, int], **kw: Any) -> Any:
        return c.chat.completions.create(
            model="g", messages=[{"role": "user", "content": ask[0]}], max_tokens=ask[1],
            temperature=0, logit_bias={str(EOS): -100}, **kw)

    night_stream = chat(client("night-secret"), NIGHT, stream=True)
    chunks = iter(night_stream)
    night = [next(chunks).choices[0].delta.content or ""]  # under way: the batch's one row
    ended: dict[str, float] = {}

    def read_night() -> None:
        for chunk in chunks:
            night.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
        ended["night"] = time.monotonic()

    reader = threading.Thread(target=read_night)
    reader.start()
    day = chat(client("day-secret"), DAY)
    ended["day"] = time.monotonic()
    reader.join(120)
    assert not reader.is_alive()
    assert ended["day"] < ended["night"], ended  # not behind the night's 160 tokens
    assert [day.choices[0].message.content, "".join(night)] == mlx_lm_greedy(model, [DAY, NIGHT])
    assert d.instance("g")["restarts"] == 0


def test_requests_past_the_width_wait_in_the_engine_within_the_queues_bound(
        daemons: Callable[..., Daemon], tiny_model: Path) -> None:
    d = daemons({"instances": {"g": {"model": str(tiny_model), "max_concurrency": 1,
                                     "max_queue": 2}}})
    d.start()
    d.until_instance("g", lambda i: i["state"] == "ready" and i["serving"] is not None,
                     what="the instance ready, with its engine's figures")
    c = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0, timeout=120)
    asks = [(f"Story {k}.", 120) for k in range(3)]
    with ThreadPoolExecutor(3) as pool:
        running = [pool.submit(lambda a: c.chat.completions.create(
            model="g", messages=[{"role": "user", "content": a[0]}], max_tokens=a[1],
            temperature=0, logit_bias={str(EOS): -100}), a) for a in asks]
        # 1 in the batch and 2 waiting, all three in the runner's engine: the next is refused.
        d.until_instance("g", lambda i: i["serving"]["active"] == 3,
                         what="three requests in the engine")
        with pytest.raises(openai.RateLimitError):
            c.chat.completions.create(model="g", messages=[{"role": "user", "content": "Hi."}],
                                      max_tokens=1)
        texts = [f.result().choices[0].message.content for f in running]
    assert texts == mlx_lm_greedy(tiny_model, asks)
