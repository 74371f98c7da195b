"""READY means it can generate: a model whose weights load but whose first token fails (a
checkpoint with a complex64 layer norm: every file valid, every shape right) is a load failure,
alone and in a 2-rank group of either kind. The instance ends `failed` with the reason (exit 65,
never retried), `exoctl status` shows it, and a user's first request meets a clean 503, never
a traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from tests.models.tiny import corrupt_model
from tests.harness import Daemon

LAYOUTS = {"alone": {}, "pipe": {"shards": 2}, "tensor": {"shards": 2, "parallelism": "tensor"}}


def test_a_model_whose_first_token_fails_never_becomes_ready(
        daemons: Callable[..., Daemon], tiny_model: Path, tmp_path: Path) -> None:
    bad = corrupt_model(tiny_model, tmp_path / "complex-norm", "forward")
    d = daemons({"instances": {name: {"model": str(bad), **extra}
                               for name, extra in LAYOUTS.items()}})
    d.start()
    d.watch_until(lambda s: all(i["state"] == "failed" for i in s["instances"]),
                  what="every instance failed")
    for name in LAYOUTS:
        inst = d.instance(name)
        assert inst["restarts"] == 0, f"{name}: a model that cannot generate is not retried"
        codes = [r["last_exit"]["code"] for r in inst["ranks"]]
        # The rank that ran the broken layer exits 65; a pipeline's other rank may instead
        # leave because its peer went away (76), never having reported ready.
        assert 65 in codes and set(codes) <= {65, 76}, (name, codes)
        assert "the first token failed" in inst["reason"], (name, inst["reason"])
        assert "rms_norm" in inst["reason"] and "complex64" in inst["reason"], inst["reason"]
        states = [e["extra"]["new"] for e in d.events(event="state", instance=name)]
        assert "loading" in states and "ready" not in states, (name, states)
    table = d.ctl("status").stdout
    for name in LAYOUTS:
        row = next(line for line in table.splitlines() if line.startswith(f"{name} "))
        assert row.split()[1] == "failed" and "first token failed" in row, table
    client = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0)
    for name in LAYOUTS:
        with pytest.raises(openai.APIStatusError) as err:
            client.completions.create(model=name, prompt="hello", max_tokens=2)
        assert err.value.status_code == 503, name
        assert "Traceback" not in err.value.response.text
    assert "Traceback" not in d.log_text()
    assert d.terminate() == 0
