"""On-demand instances, with real runners of the tiny model: the first request starts one and
waits while it loads; idle ones stop; idle ones are evicted, least recently used first, to
make room, and an always-on one never is. (Memory refusals and hangs: test_faults.py.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from exod.facts.model_dir import model_config
from exod.core.memory import estimate, model_tensors
from exod.core.shards import Shard
from tests.harness import Daemon
from tests.integration.test_faults import huge_model

EOS = "2"  # the tiny model's end token: logit_bias {EOS: -100} keeps it generating
HELLO = [{"role": "user", "content": "hello"}]


def client(d: Daemon, timeout: float = 120) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0,
                         timeout=timeout)


def need(model: Path, concurrency: int) -> int:
    tensors, config = model_tensors(model), model_config(model)
    return estimate(tensors, config, Shard(0, 1, 0, 4, 4), "pipeline", "auto", True,
                    concurrency, 4096).total


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
    assert e.value.status_code == 503 and "needs 2TiB" in str(e.value.message)
    assert d.instance("always")["state"] == "ready"
