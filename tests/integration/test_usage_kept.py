"""Usage that is kept, through a real daemon: a usage log line for every finished request in
every dialect, with the tokens its client was told (the prompt's counted by the model's own
tokenizer), all there after `kill -9` of the daemon; `exoctl usage` summing it, as a table and
as JSON; each key's figures in /metrics, labelled by the operator's key names only; the
status page's busiest keys; and the audit log's line for a `manage` request, refused or not."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tokenizers

from tests.harness import Daemon
from tests.integration.test_key_limits import ASK, Clients, keys_config, secret


@pytest.fixture
def kept(tiny_model: Path, tmp_path: Path) -> Iterator[Daemon]:
    keys = keys_config({"free": {}, "alice": {}})
    keys.append({"name": "puller", "hash": keys_config({"puller": {}})[0]["hash"],
                 "scopes": ["infer", "manage"]})
    d = Daemon({"api": {"listen": "127.0.0.1:0", "keys": keys},
                "usage": {"folder": str(tmp_path / "usage"), "max_file_mib": 1},
                "instances": {"tiny": {"model": str(tiny_model)}}}, name="usage")
    try:
        d.start()
        d.until_state("tiny", "ready")
        yield d
    finally:
        d.close()


def records(folder: Path, stem: str = "usage") -> list[dict[str, Any]]:
    return [json.loads(x) for f in sorted(folder.glob(f"{stem}-*.jsonl"))
            for x in f.read_text().splitlines() if x]


def test_every_finished_request_is_in_the_log_after_kill_9(kept: Daemon, tmp_path: Path,
                                                           tiny_model: Path) -> None:
    c = Clients(kept.api_url(), "alice")
    told: list[tuple[str, int, int]] = []  # dialect, prompt and completion tokens as answered
    r = c.chat(5)
    told.append(("chat", r.usage.prompt_tokens, r.usage.completion_tokens))
    chunks = list(c.chat(6, stream=True, stream_options={"include_usage": True}))
    u = chunks[-1].usage
    told.append(("chat", u.prompt_tokens, u.completion_tokens))
    prompt = "def main():\n    return"
    p = c.openai.completions.create(model="tiny", prompt=prompt, max_tokens=3, temperature=0)
    told.append(("completion", p.usage.prompt_tokens, p.usage.completion_tokens))
    resp = c.openai.responses.create(model="tiny", input="hello", max_output_tokens=4)
    told.append(("responses", resp.usage.input_tokens, resp.usage.output_tokens))
    m = c.claude.messages.create(model="tiny", max_tokens=4, messages=ASK)  # type: ignore[arg-type]
    told.append(("messages", m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0),
                 m.usage.output_tokens))
    o = c.ollama.chat(model="tiny", messages=ASK, options={"num_predict": 3})
    told.append(("ollama_chat", o.prompt_eval_count or 0, o.eval_count or 0))
    g = c.ollama.generate(model="tiny", prompt="hello", options={"num_predict": 3},
                          stream=False)
    told.append(("ollama_generate", g.prompt_eval_count or 0, g.eval_count or 0))

    kept.terminate(signal.SIGKILL)  # nothing flushed at a stop: what is there was there
    lines = records(tmp_path / "usage")
    assert [(x["dialect"], x["prompt_tokens"], x["completion_tokens"]) for x in lines] == told
    tok = tokenizers.Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    assert lines[2]["prompt_tokens"] == len(tok.encode(prompt).ids)
    for x in lines:
        assert (x["key"], x["instance"], x["model"], x["status"]) == ("alice", "tiny", "tiny",
                                                                        200)
        assert x["time"].endswith("Z") and 0 < x["batch_seconds"] <= x["duration_seconds"]
        assert x["cached_tokens"] <= x["prompt_tokens"]
        assert secret("alice") not in json.dumps(x)

    kept.start()  # exoctl usage sums the log, the records of before the kill included
    out = json.loads(kept.ctl("usage", "--json").stdout)
    assert out["folder"] == str(tmp_path / "usage")
    (sums,) = out["sums"]
    assert sums["key"] == "alice" and sums["instance"] == "tiny"
    assert sums["requests"] == len(told) and sums["failed"] == 0
    assert sums["prompt_tokens"] == sum(t[1] for t in told)
    assert sums["completion_tokens"] == sum(t[2] for t in told)
    assert sums["cached_tokens"] == sum(x["cached_tokens"] for x in lines)
    assert json.loads(kept.ctl("usage", "--json", "--key", "bob").stdout)["sums"] == []
    table = kept.ctl("usage", "--since", "1d").stdout.splitlines()
    assert table[0] == f"usage log: {tmp_path / 'usage'} (the last 1d)"
    assert table[1].split() == ["KEY", "INSTANCE", "REQUESTS", "FAILED", "PROMPT", "CACHED",
                                "COMPLETION", "BATCH", "TIME"]
    assert table[2].split()[:4] == ["alice", "tiny", str(len(told)), "0"]
    assert kept.ctl("usage", "--since", "soon", check=False).returncode == 2


def test_metrics_status_page_and_audit(kept: Daemon, tmp_path: Path) -> None:
    url = kept.api_url()
    Clients(url, "alice").chat(3)
    wrong = httpx.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": ASK},
                       headers={"Authorization": "Bearer exod-not-a-key"}, timeout=30)
    assert wrong.status_code == 401
    admin = {"Authorization": f"Bearer {secret('free')}"}
    metrics = httpx.get(url + "/metrics", headers=admin, timeout=30).text
    assert 'exod_key_requests_total{instance="tiny",key="alice"} 1.0' in metrics
    assert 'exod_key_completion_tokens_total{instance="tiny",key="alice"} 3.0' in metrics
    for family in ("prompt_tokens", "cached_tokens", "batch_seconds"):
        assert f'exod_key_{family}_total{{instance="tiny",key="alice"}}' in metrics
    keys_seen = {x.split('key="')[1].split('"')[0] for x in metrics.splitlines()
                 if x.startswith("exod_key_") and 'key="' in x}
    assert keys_seen <= {"alice", "free", "puller"}  # the config's names, nothing a client sent

    page = httpx.get(url + "/status.json", headers=admin, timeout=30).json()
    assert page["keys"][0]["key"] == "alice" and page["keys"][0]["recent_tokens"] > 3
    assert page["keys"][0]["in_flight"] == 0 and page["keys_span_s"] == 300

    # The audit log: a `manage` request refused for want of the scope, and one let in.
    no = httpx.request("DELETE", url + "/api/delete", json={"model": "hf:nobody/nothing"},
                       headers={"Authorization": f"Bearer {secret('alice')}"}, timeout=30)
    assert no.status_code == 403
    yes = httpx.request("DELETE", url + "/api/delete", json={"model": "hf:nobody/nothing"},
                        headers={"Authorization": f"Bearer {secret('puller')}"}, timeout=30)
    audit = records(tmp_path / "usage", "audit")
    assert [(x["key"], x["action"], x["status"]) for x in audit] == [
        ("alice", "DELETE /api/delete", 403), ("puller", "DELETE /api/delete", yes.status_code)]
    assert audit[1]["model"] == "hf:nobody/nothing" and audit[1]["time"].endswith("Z")
    assert not any(secret(n) in json.dumps(audit) for n in ("alice", "puller"))
