"""A 2-rank group (pipeline and tensor) serves as one rank does: every rank runs the same batch
engine on the same requests (exod.runner.group.lockstep), so a group batches, caches prompts and
reproduces seeds. Real runners, the ring backend on loopback, the official openai client, and
in-process mlx-lm as the reference for the greedy text."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.harness import Daemon
from tests.integration.test_serving_engine import QUESTIONS, ask, serving

EOS = 2  # the tiny model's end token, banned so that every answer has exactly max_tokens
GREEDY: dict[str, Any] = {"max_tokens": 24, "temperature": 0, "logit_bias": {str(EOS): -100}}
SEEDED: dict[str, Any] = {"max_tokens": 16, "temperature": 1.0, "seed": 1234}

MLX_LM = """
import json, sys
from mlx_lm import generate, load
from mlx_lm.sample_utils import make_logits_processors
model, tok = load(sys.argv[1])
ban = make_logits_processors(logit_bias={EOS: -100.0})
out = []
for q in json.loads(sys.argv[2]):
    prompt = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
    out.append(generate(model, tok, prompt, max_tokens=MAX, logits_processors=ban))
print(json.dumps(out))
""".replace("EOS", str(EOS)).replace("MAX", str(GREEDY["max_tokens"]))


def mlx_lm_greedy(model: Path, questions: list[str]) -> list[str]:
    """In-process mlx-lm's greedy text (in a subprocess: the test process never imports mlx)."""
    out = subprocess.run([sys.executable, "-c", MLX_LM, str(model), json.dumps(questions)],
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    texts: list[str] = json.loads(out.strip().splitlines()[-1])
    return texts


def group(daemons: Callable[..., Daemon], model: Path, parallelism: str, **kw: Any) -> Daemon:
    d = daemons({"instances": {"g": {"model": str(model), "shards": 2,
                                     "parallelism": parallelism, "max_concurrency": 8,
                                     "backoff": {"initial": "100ms", "jitter": 0}, **kw}}})
    d.start()
    d.until_instance("g", lambda i: i["state"] == "ready" and i["serving"] is not None,
                     what="the group ready, with its engine's figures")
    return d


@pytest.mark.parametrize("parallelism", ["pipeline", "tensor"])
def test_a_group_batches_caches_and_reproduces_like_one_rank(
        daemons: Callable[..., Daemon], tiny_model_factory: Callable[..., Path],
        parallelism: str) -> None:
    model = tiny_model_factory(layers=6)
    d = group(daemons, model, parallelism)
    s = serving(d, "g")
    assert s["batching"] == "continuous" and s["width"] == 8, s

    # The second turn of a chat starts from the first turn's KV cache, on every rank.
    turn1: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
    c = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0, timeout=120)
    r1 = c.chat.completions.create(model="g", messages=turn1, **GREEDY)
    turn2 = [*turn1, {"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "And of Italy?"}]
    r2 = c.chat.completions.create(model="g", messages=turn2, **GREEDY)
    assert r1.usage is not None and r2.usage is not None
    # The engine's figures follow the answer's last event on the channel: waited for.
    snap = d.until_instance("g", lambda i: i["serving"]["prompt_cache"]["lookups"] == 2,
                            what="the second lookup in the status")
    cache = snap["serving"]["prompt_cache"]
    assert cache["hits"] == 1 and cache["cached_tokens"] >= r1.usage.prompt_tokens, cache
    assert r2.usage.completion_tokens == GREEDY["max_tokens"]

    # Alone, then 8 greedy and 2 seeded requests at once: the same text for each, and the
    # greedy text is in-process mlx-lm's.
    alone = [ask(d, "g", q, **GREEDY) for q in QUESTIONS]
    seeded_alone = ask(d, "g", QUESTIONS[0], **SEEDED)
    assert alone == mlx_lm_greedy(model, QUESTIONS)
    jobs = [(q, GREEDY) for q in QUESTIONS] + [(QUESTIONS[0], SEEDED)] * 2
    with ThreadPoolExecutor(len(jobs)) as pool:
        running = [pool.submit(ask, d, "g", q, **kw) for q, kw in jobs]
        # They really run as one batch (not one after the other).
        d.until_instance("g", lambda i: (i["serving"] or {}).get("active", 0) >= 4,
                         what="several requests in the group's batch at once")
        together = [f.result() for f in running]
    assert together[:8] == alone
    assert together[8] == together[9] == seeded_alone
    assert len(set(alone)) == 8
    assert d.instance("g")["restarts"] == 0


@pytest.mark.parametrize(("parallelism", "victim"), [("pipeline", 1), ("tensor", 0)])
def test_a_peer_killed_mid_batch_ends_the_group_as_peer_lost(
        daemons: Callable[..., Daemon], tiny_model_factory: Callable[..., Path],
        parallelism: str, victim: int) -> None:
    """Every request in the batch fails (no hang); the surviving rank leaves on its own, by
    PeerLost (exit 76) or the ladder's first rung, and the group comes back."""
    d = group(daemons, tiny_model_factory(layers=6), parallelism)
    pids = [r["pid"] for r in d.instance("g")["ranks"]]
    c = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0, timeout=120)
    streams = [iter(c.chat.completions.create(
        model="g", messages=[{"role": "user", "content": q}], max_tokens=4000, temperature=0,
        logit_bias={str(EOS): -100}, stream=True)) for q in QUESTIONS[:4]]
    for it in streams:
        next(it)  # every one is under way
    d.until_instance("g", lambda i: (i["serving"] or {}).get("active") == 4,
                     what="four requests in the batch")
    os.kill(pids[victim], signal.SIGKILL)
    for it in streams:
        with pytest.raises(openai.APIError):
            for _ in it:
                pass
    d.until_instance("g", lambda i: i["state"] == "ready" and i["restarts"] == 1,
                     what="the group to restart")
    exits = {e["extra"]["pid"]: e["extra"] for e in d.events(event="exit", instance="g")}
    survivor = exits[pids[1 - victim]]
    assert survivor["signal"] is None and survivor["code"] in (0, 76), survivor
    steps = [e["extra"]["step"] for e in d.events(event="ladder", instance="g")]
    assert "SIGKILL" not in steps and "SIGTERM" not in steps, steps
    assert ask(d, "g", "Say hi.", **GREEDY)


def test_the_prompt_cache_evicts_the_same_entries_on_every_rank(
        daemons: Callable[..., Daemon], tiny_model_factory: Callable[..., Path]) -> None:
    """Rank 1 owns a third of the layers, so its cache entries hold far fewer bytes than rank
    0's: evicting by its own bytes, it would keep entries rank 0 dropped, find a cached prompt
    where rank 0 finds none, and the two would run forwards of different lengths. It keeps
    rank 0's entries instead, and the group stays in step."""
    fixed: dict[str, Any] = {"max_tokens": 20, "temperature": 0, "logit_bias": {str(EOS): -100}}
    d = group(daemons, tiny_model_factory(layers=6), "pipeline", layers=[4, 2],
              peer_timeout="5s")
    prompts = ["apples and pears", "zebras in a field", "quiet morning rain"]
    first = ask(d, "g", prompts[0], **fixed)
    one = d.until_instance("g", lambda i: i["serving"]["prompt_cache"]["entries"] == 1,
                           what="the first entry in the status")["serving"]["prompt_cache"]["bytes"]
    cap = one * 3 // 2
    config = yaml.safe_load(d.config_path.read_text())
    config["instances"]["g"]["prompt_cache_bytes"] = cap
    d.write_config(config)
    d.ctl("reload")
    d.until_instance("g", lambda i: i["state"] == "ready" and i["serving"] is not None
                     and i["serving"]["prompt_cache"]["max_bytes"] == cap,
                     what="the group to restart with the new cap")
    for p in prompts:
        ask(d, "g", p, **fixed)
    snap = d.until_instance("g", lambda i: i["serving"]["prompt_cache"]["lookups"] == 3,
                            what="the third lookup in the status")
    assert snap["serving"]["prompt_cache"]["entries"] == 1
    # prompts[0] is gone from rank 0's cache (rank 1 alone could still hold it).
    assert ask(d, "g", prompts[0], **fixed) == first
    assert ask(d, "g", prompts[2], **fixed)
    inst = d.instance("g")
    assert inst["state"] == "ready" and inst["restarts"] == 0, inst
