"""Operating it day to day, with real runners of the tiny model: memory admission (a model too
large is refused before any runner starts), on-demand instances (the first request starts one
and waits; idle ones stop; idle ones are evicted, least recently used first, to make room) and
hang detection while serving (a SIGSTOPped runner is noticed, its requests get 503 `hung`, and
it restarts through the ladder)."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from exod.config.model_dir import model_config
from exod.core.memory import estimate, model_tensors
from exod.core.shards import Shard
from tests.harness import EXOD, Daemon

EOS = "2"  # the tiny model's end token: logit_bias {EOS: -100} keeps it generating
HELLO = [{"role": "user", "content": "hello"}]


def client(d: Daemon, timeout: float = 120) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0,
                         timeout=timeout)


def huge_model(src: Path, dest: Path, tib: int = 2) -> Path:
    """The tiny model's config with a sparse weight file whose valid header declares `tib`
    TiB of float32: nothing to read, and far more than any host has."""
    dest.mkdir()
    (dest / "config.json").write_text((src / "config.json").read_text())
    nbytes = tib * 2**40
    header = json.dumps({"model.layers.0.mlp.weight": {
        "dtype": "F32", "shape": [nbytes // 4], "data_offsets": [0, nbytes]}}).encode()
    with open(dest / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + nbytes)
    return dest


def need(model: Path, concurrency: int) -> int:
    tensors, config = model_tensors(model), model_config(model)
    return estimate(tensors, config, Shard(0, 1, 0, 4, 4), "pipeline", "auto", True,
                    concurrency, 4096).total


def test_too_large_is_refused_before_any_runner(daemons: Callable[..., Daemon], tiny_model: Path,
                                                tmp_path: Path) -> None:
    huge = huge_model(tiny_model, tmp_path / "huge")
    d = daemons({"instances": {"huge": {"model": str(huge)}}})
    d.start()
    inst = d.until_state("huge", "failed")
    assert "not enough memory: needs 2048.4 GiB," in inst["detail"], inst
    assert " GiB available" in inst["detail"]
    assert inst["restarts"] == 0 and inst["ranks"][0]["pid"] is None
    assert not d.events(event="exit"), "no runner may have started"
    out = subprocess.run([*EXOD, "check", "-c", str(d.config_path)], capture_output=True,
                         text=True, check=True).stdout
    assert "huge: needs 2048.4 GiB (weights 2048.0 GiB, KV cache " in out, out
    # A start by the operator is refused the same way, with the figures.
    res = d.ctl("start", "huge", check=False)
    assert "failed" in res.stdout + res.stderr
    assert "needs 2048.4 GiB" in d.instance("huge")["detail"]


def test_on_demand_start_eviction_and_idle_stop(daemons: Callable[..., Daemon],
                                                tiny_model: Path, tmp_path: Path) -> None:
    big, small = need(tiny_model, 256), need(tiny_model, 1)
    assert big > 2 * small  # the KV headroom of 256 generations dominates
    # Room for the always-on one and one big on-demand one, never two.
    budget = small + big * 3 // 2
    huge = huge_model(tiny_model, tmp_path / "huge")
    on_demand: dict[str, Any] = {"model": str(tiny_model), "autostart": "on-demand",
                                 "max_concurrency": 256}
    d = daemons({"defaults": {"memory_headroom": 0}, "instances": {
        "always": {"model": str(tiny_model)},
        "a": on_demand,
        "b": {**on_demand, "idle_stop_after": "1s"},
        "huge": {"model": str(huge), "autostart": "on-demand"}}},
        env={"EXOD_MEMORY_AVAILABLE": str(budget)})
    d.start()
    d.until_state("always", "ready")
    assert d.instance("a")["detail"] == "stopped (starts on demand)"
    c = client(d)

    # The first request starts `a` and waits while it loads.
    r = c.chat.completions.create(model="a", messages=HELLO, max_tokens=3)
    assert r.choices[0].message.content is not None
    assert d.instance("a")["state"] == "ready"

    # `b` does not fit beside `a`: idle `a` is stopped to make room (never `always`).
    c.chat.completions.create(model="b", messages=HELLO, max_tokens=3)
    states = {i["name"]: i["state"] for i in d.status()["instances"]}
    assert states["a"] == "stopped" and states["always"] == "ready", states
    assert d.events(event="ladder", instance="a"), "a was stopped through the ladder"

    # `b` stops itself after a second without requests.
    d.until_instance("b", lambda i: i["state"] == "stopped", what="b stopped when idle")
    assert any("idle for" in line for line in d.log_text().splitlines())

    # Nothing can make room for `huge`: refused, with the figures, and the request gets 503.
    with pytest.raises(openai.APIStatusError) as e:
        c.chat.completions.create(model="huge", messages=HELLO, max_tokens=3)
    assert e.value.status_code == 503 and "needs 2048.4 GiB" in str(e.value.message)
    assert d.instance("always")["state"] == "ready"


def test_a_hung_runner_is_noticed_and_replaced(daemons: Callable[..., Daemon],
                                               tiny_model: Path) -> None:
    d = daemons({"instances": {"tiny": {
        "model": str(tiny_model), "hang_after": "2s",
        "stop": {"grace": "1s", "attempts": 1, "interval": "1s"}}}})
    d.start()
    d.until_state("tiny", "ready")
    old = d.instance("tiny")["ranks"][0]["pid"]
    c = client(d)
    stream = c.chat.completions.create(model="tiny", messages=HELLO, stream=True,
                                       max_tokens=1_000_000, logit_bias={EOS: -100})
    chunks = iter(stream)
    next(chunks)
    next(chunks)  # generating: now the runner stops dead
    os.kill(old, signal.SIGSTOP)
    try:
        with pytest.raises(openai.APIError) as e:
            for _ in chunks:
                pass
        assert "hung" in str(e.value), e.value
        inst = d.until_instance("tiny", lambda i: i["detail"].startswith(
            "hung (no progress for 2s)"), what="status says hung")
        assert inst["state"] in ("stopping", "backoff")
        resp = c.with_options(max_retries=0).models.retrieve("tiny")
        assert resp.state != "ready"  # type: ignore[attr-defined]
        inst = d.until_instance("tiny", lambda i: i["state"] == "ready" and i["ranks"][0][
            "pid"] != old, what="tiny restarted")
        assert inst["restarts"] == 1
        assert "SIGKILL" in [e["extra"]["step"] for e in d.events(event="ladder")]
    finally:
        try:
            os.kill(old, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # The replacement serves.
    assert c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2).choices
