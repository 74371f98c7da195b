"""The fault matrix, against one live daemon with real runners of the tiny model (and a
controllable double for the load that is killed mid-way). Each fault, what exod must do:

| fault                                  | expected                                            |
| -------------------------------------- | --------------------------------------------------- |
| truncated weights                      | `failed` with the reason, one attempt, no loop      |
| a model too large for memory           | refused before any runner starts, with the figures  |
| runner SIGKILL mid-load                | backoff, then a new runner loads to ready           |
| runner SIGKILL mid-generation          | the request ends with 503, the instance comes back  |
| runner SIGSTOP while serving           | 503 `hung`, status says so, replaced (hang_after)   |
| a burst at the limit                   | every request 200, or 429 with Retry-After          |
| a bad reload                           | refused; every runner keeps running, same pids      |
| kill -9 of exod                        | no runner survives it                               |

The tests share the daemon and run in this order (the last one kills it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.models.tiny import corrupt_model
from tests.harness import Daemon, wait_pid_gone
from tests.integration.conftest import double_env

EOS = "2"  # the tiny model's end token: logit_bias {EOS: -100} keeps it generating
HELLO = [{"role": "user", "content": "hello"}]
ENDLESS: dict[str, Any] = {"max_tokens": 100_000,  # within the window (tiny.CONTEXT)
                          "logit_bias": {EOS: -100}}
QUICK_STOP = {"grace": "1s", "attempts": 1, "interval": "1s"}


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


class Live:
    def __init__(self, d: Daemon, gate: Path) -> None:
        self.d = d
        self.gate = gate
        self.client = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0,
                                    timeout=120)

    def pid(self, name: str) -> int:
        return int(self.d.instance(name)["ranks"][0]["pid"])


@pytest.fixture(scope="module")
def live(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("faults")
    fake = tmp / "fake"
    fake.mkdir()
    (fake / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 4}')
    gate = tmp / "gate"
    d = Daemon({"instances": {
        "tiny": {"model": str(tiny_model), "hang_after": "3s", "stop": QUICK_STOP,
                 "max_concurrency": 1, "max_queue": 2},
        "truncated": {"model": str(corrupt_model(tiny_model, tmp / "truncated"))},
        "huge": {"model": str(huge_model(tiny_model, tmp / "huge"))},
        "loader": {"model": str(fake), "env": {**double_env("gated"),
                                                "EXOD_DOUBLE_GATE": str(gate)}},
    }})
    try:
        d.start()
        d.until_state("tiny", "ready")
        yield Live(d, gate)
    finally:
        d.close()


def test_truncated_weights_fail_once_with_the_reason(live: Live) -> None:
    inst = live.d.until_state("truncated", "failed")
    assert "exit code 65" in inst["detail"] and "safetensors" in inst["detail"].lower(), inst
    assert inst["restarts"] == 0
    assert len(live.d.events(event="exit", instance="truncated")) == 1, "no retry loop"


def test_a_model_too_large_is_refused_before_any_runner(live: Live) -> None:
    inst = live.d.until_state("huge", "failed")
    assert "not enough memory: needs 2TiB, " in inst["detail"], inst
    assert "iB available" in inst["detail"]
    assert inst["ranks"][0]["pid"] is None and inst["restarts"] == 0
    assert not live.d.events(event="exit", instance="huge"), "no runner may have started"
    assert "needs 2TiB" in live.d.ctl("start", "huge", check=False).stderr


def test_runner_sigkill_mid_load_restarts_and_loads(live: Live) -> None:
    d = live.d
    d.until_instance("loader", lambda i: i["state"] == "loading" and i["ranks"][0][
        "layers_loaded"] == 3, what="loader at 3/4")
    old = live.pid("loader")
    os.kill(old, signal.SIGKILL)
    d.until_instance("loader", lambda i: i["state"] == "backoff", what="loader backing off")
    live.gate.touch()  # the next load may finish
    inst = d.until_state("loader", "ready")
    assert inst["restarts"] == 1 and inst["ranks"][0]["pid"] != old
    assert inst["ranks"][0]["last_exit"]["signal"] == signal.SIGKILL


def test_runner_sigkill_mid_generation_ends_the_request_and_comes_back(live: Live) -> None:
    d = live.d
    old = live.pid("tiny")
    chunks = iter(live.client.chat.completions.create(model="tiny", messages=HELLO,
                                                      stream=True, **ENDLESS))
    next(chunks)
    next(chunks)
    os.kill(old, signal.SIGKILL)
    with pytest.raises(openai.APIError) as e:
        for _ in chunks:
            pass
    assert "runner" in str(e.value).lower(), e.value
    inst = d.until_instance("tiny", lambda i: i["state"] == "ready" and i["ranks"][0][
        "pid"] != old, what="tiny back")
    assert inst["restarts"] >= 1
    assert live.client.chat.completions.create(model="tiny", messages=HELLO,
                                               max_tokens=2).choices


def test_runner_sigstop_while_serving_is_hung_and_replaced(live: Live) -> None:
    d = live.d
    old = live.pid("tiny")
    restarts = d.instance("tiny")["restarts"]
    chunks = iter(live.client.chat.completions.create(model="tiny", messages=HELLO,
                                                      stream=True, **ENDLESS))
    next(chunks)
    next(chunks)  # generating: now the runner stops dead
    os.kill(old, signal.SIGSTOP)
    try:
        with pytest.raises(openai.APIError) as e:
            for _ in chunks:
                pass
        assert "hung" in str(e.value), e.value
        inst = d.until_instance("tiny", lambda i: i["detail"].startswith(
            "hung (no progress for 3s)"), what="status says hung")
        assert inst["state"] in ("stopping", "backoff")
        ready = live.client.with_options(max_retries=0).models.retrieve("tiny")
        assert ready.state != "ready"  # type: ignore[attr-defined]
        inst = d.until_instance("tiny", lambda i: i["state"] == "ready" and i["ranks"][0][
            "pid"] != old, what="tiny replaced")
        assert inst["restarts"] == restarts + 1
        assert "SIGKILL" in [e["extra"]["step"] for e in d.events(event="ladder",
                                                                   instance="tiny")]
    finally:
        try:
            os.kill(old, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert live.client.chat.completions.create(model="tiny", messages=HELLO,
                                               max_tokens=2).choices


def test_a_burst_at_the_limit_gets_200_or_429_with_retry_after(live: Live) -> None:
    url = live.d.api_url()

    async def burst() -> list[Any]:
        c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=120)

        async def one(i: int) -> Any:
            try:
                return await c.chat.completions.with_raw_response.create(
                    model="tiny", messages=[{"role": "user", "content": f"r{i}"}],
                    max_tokens=20, logit_bias={EOS: -100})
            except openai.APIStatusError as e:
                return e

        async with c:
            return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(12))), 300)

    results = asyncio.run(burst())
    ok = [r for r in results if not isinstance(r, openai.APIStatusError)]
    refused = [r for r in results if isinstance(r, openai.APIStatusError)]
    assert len(ok) >= 3 and refused  # 1 running + 2 queued at least; the rest refused
    assert all(r.http_response.status_code == 200 for r in ok)
    for e in refused:
        assert e.status_code == 429 and e.code == "queue_full", e
        assert e.response.headers.get("Retry-After") == "1"


def test_a_bad_reload_disturbs_nothing(live: Live) -> None:
    d = live.d
    before = {i["name"]: (i["state"], i["ranks"][0]["pid"]) for i in d.status()["instances"]}
    good = d.config_path.read_text()
    d.config_path.write_text(good + "  oops: {model: 42, shards: lots}\n")
    try:
        res = d.ctl("reload", check=False)
        assert res.returncode == 1 and "instances.oops" in res.stderr, res.stderr
    finally:
        d.config_path.write_text(good)
    after = {i["name"]: (i["state"], i["ranks"][0]["pid"]) for i in d.status()["instances"]}
    assert after == before
    assert live.client.chat.completions.create(model="tiny", messages=HELLO,
                                               max_tokens=2).choices


def test_kill_9_of_exod_leaves_no_runner(live: Live) -> None:
    d = live.d
    pids = [r["pid"] for i in d.status()["instances"] for r in i["ranks"] if r["pid"]]
    assert len(pids) == 2  # tiny and loader
    assert d.proc is not None
    d.proc.kill()
    d.proc.wait(10)
    for pid in pids:
        assert wait_pid_gone(pid, 30), f"runner {pid} outlived its daemon"
