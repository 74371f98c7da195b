"""Embeddings and reranking through the daemon, with real runners on the tiny embedding zoo
(tests.models.embed_zoo): BERT, ModernBERT and Qwen3-Embedding-style vectors equal to in-process
mlx-vlm's within 1e-5 cosine, in a batch as alone; `dimensions` and base64 round trips; a rerank
whose order follows its scores, from a reranker started on demand and stopped when idle; the
official openai client's `embeddings.create` and the ollama client's `embed` and `embeddings` as
written; token arrays; the length rule; a chat request to an embedding instance and the reverse
refused by what each serves; inputs past the bounds refused within seconds; an abandoned request
cancelled in the runner; /v1/models and /metrics.

One daemon for the module, five runners (the reranker's started on demand; about 3 CPU-s each,
mostly imports) and one reference process: 13-15 CPU-s in all as measured (user + sys of the
whole run, its processes waited for), 1.5-5.5 minutes of wall time on a loaded 2-core host.
"""
from __future__ import annotations

import array
import http.client
import base64
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import ollama
import openai
import pytest
import requests

from tests.harness import REPO, Daemon

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog",
         " ".join(f"word{i}" for i in range(80)),  # past bert's 48 tokens: cut to them
         "x", "Ünïcödé and emoji 🎉 too"]
QUERY = "where does the fox jump"
FAMILIES = ("bert", "modernbert", "qwen3")


@dataclass
class Served:
    d: Daemon
    url: str
    ref: dict[str, list[Any]]  # family -> reference vectors (reranker: scores) of TEXTS

    def post(self, path: str, body: dict[str, Any], timeout: float = 60) -> requests.Response:
        return requests.post(self.url + path, json=body, timeout=timeout)

    def embed(self, model: str, inputs: Any, **kw: Any) -> dict[str, Any]:
        r = self.post("/v1/embeddings", {"model": model, "input": inputs, **kw})
        assert r.status_code == 200, r.text
        got: dict[str, Any] = r.json()
        return got


def references(zoo: Path) -> dict[str, list[Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.models.embed_zoo", str(zoo),
         *[a for t in TEXTS for a in ("--text", t)], "--query", QUERY],
        cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
        timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    made = json.loads(proc.stdout.strip().splitlines()[-1])
    return {family: info["reference"] for family, info in made.items()}


@pytest.fixture(scope="module")
def served(embed_zoo: Path, tiny_model: Path) -> Iterator[Served]:
    ref = references(embed_zoo)
    d = Daemon({"api": {"listen": "127.0.0.1:0", "max_body_kib": 16384},
                "instances": {
                    **{f: {"model": str(embed_zoo / f)} for f in FAMILIES},
                    # Started by its first request, stopped when idle, as any instance.
                    "reranker": {"model": str(embed_zoo / "reranker"),
                                 "autostart": "on-demand", "idle_stop_after": "2s"},
                    # Never started: a request for another kind is refused from its files.
                    "chat": {"model": str(tiny_model), "autostart": "on-demand"}}})
    try:
        d.start()
        d.watch_until(lambda s: all(i["state"] == "ready" for i in s["instances"]
                                    if i["name"] in FAMILIES), what="the encoders ready")
        yield Served(d, d.api_url(), ref)
    finally:
        d.close()


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def floats(b64: str) -> list[float]:
    return array.array("f", base64.b64decode(b64)).tolist()


# ---- vectors -----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_vectors_equal_mlx_vlm_in_process_in_a_batch_and_alone(served: Served,
                                                               family: str) -> None:
    together = served.embed(family, TEXTS)
    alone = [served.embed(family, t)["data"][0]["embedding"] for t in TEXTS]
    assert [e["index"] for e in together["data"]] == list(range(len(TEXTS)))
    for got, one, want in zip(together["data"], alone, served.ref[family], strict=True):
        vec = got["embedding"]
        assert len(vec) == 64
        assert cosine(vec, want) > 1 - 1e-5 and cosine(one, want) > 1 - 1e-5
        # Normalized as the model's files say: ModernBERT's has no Normalize module.
        norm = math.sqrt(sum(x * x for x in vec))
        assert abs(norm - math.sqrt(sum(x * x for x in want))) < 1e-3 * norm
        assert (abs(norm - 1) < 1e-5) == (family != "modernbert")
    usage = together["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > len(TEXTS)


def test_the_openai_client_embeds_as_written(served: Served) -> None:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="-", max_retries=0)
    # The client asks for base64 unless told, and decodes it: both paths.
    r = client.embeddings.create(model="bert", input=["hello world", "x"])
    plain = client.embeddings.create(model="bert", input="hello world", encoding_format="float")
    assert len(r.data) == 2 and r.model == "bert" and r.usage.prompt_tokens > 0
    assert cosine(r.data[0].embedding, served.ref["bert"][0]) > 1 - 1e-5
    assert cosine(r.data[1].embedding, served.ref["bert"][3]) > 1 - 1e-5
    assert r.data[0].embedding == pytest.approx(plain.data[0].embedding, abs=1e-7)


def test_the_ollama_client_embeds_as_written(served: Served) -> None:
    """Ollama's /api/embed: vectors of length 1 whatever the model's files say (ModernBERT's
    are not normalized), as Ollama gives them; its older /api/embeddings: as the model makes
    them; a field at fault named in the error."""
    client = ollama.Client(host=served.url)
    r = client.embed(model="modernbert", input=TEXTS[:2], keep_alive="5m")
    assert r.model == "modernbert" and r.prompt_eval_count and r.prompt_eval_count > 2
    assert r.total_duration and r.load_duration is not None
    assert r.total_duration >= r.load_duration
    for vec, want in zip(r.embeddings, served.ref["modernbert"][:2], strict=True):
        assert cosine(list(vec), want) > 1 - 1e-5
        assert abs(math.sqrt(sum(x * x for x in vec)) - 1) < 1e-5
    one = client.embed(model="bert", input=TEXTS[2], truncate=True, dimensions=32)
    assert len(one.embeddings) == 1 and len(one.embeddings[0]) == 32
    old = client.embeddings(model="modernbert", prompt=TEXTS[0])
    assert list(old.embedding) == pytest.approx(
        served.embed("modernbert", TEXTS[0])["data"][0]["embedding"], abs=1e-6)
    r2 = served.post("/api/embed", {"model": "bert", "input": TEXTS[2], "truncate": False})
    assert r2.status_code == 400 and "`input`" in r2.text and "truncate" in r2.text
    r3 = served.post("/api/embed", {"model": "chat", "input": "x"})
    assert r3.status_code == 400 and "serves chat" in r3.text, r3.text


def test_dimensions_cut_then_normalize_and_base64_round_trips(served: Served) -> None:
    full = served.embed("bert", TEXTS[:2])["data"]
    cut = served.embed("bert", TEXTS[:2], dimensions=32)["data"]
    coded = served.embed("bert", TEXTS[:2], dimensions=32, encoding_format="base64")["data"]
    for f, c, b in zip(full, cut, coded, strict=True):
        head = f["embedding"][:32]
        scale = math.sqrt(sum(x * x for x in head))
        assert c["embedding"] == pytest.approx([x / scale for x in head], abs=1e-6)
        assert floats(b["embedding"]) == pytest.approx(c["embedding"], abs=0)
    # Sizes the model was not trained for are refused by name.
    for model, size in (("bert", 20), ("qwen3", 32), ("bert", 65)):
        r = served.post("/v1/embeddings", {"model": model, "input": "x", "dimensions": size})
        assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions", r.text


def test_token_arrays_and_the_length_rule(served: Served) -> None:
    one = served.embed("qwen3", [5, 6, 7])["data"]
    two = served.embed("qwen3", [[5, 6, 7], [8, 9]])["data"]
    assert len(one) == 1 and len(two) == 2
    assert one[0]["embedding"] == pytest.approx(two[0]["embedding"], abs=1e-5)
    bad = served.post("/v1/embeddings", {"model": "qwen3", "input": [[5], [5000]]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[1]", bad.text
    long = TEXTS[2]  # more than bert's 48 tokens: cut by default, refused when asked
    assert served.embed("bert", long, truncate=True)["usage"]["prompt_tokens"] == 48
    refused = served.post("/v1/embeddings", {"model": "bert", "input": ["x", long],
                                             "truncate": False})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input[1]"


# ---- rerank ------------------------------------------------------------------------------------
def test_rerank_orders_by_scores_equal_to_mlx_vlm(served: Served) -> None:
    def state(snapshot: dict[str, Any]) -> str:
        return str(next(i["state"] for i in snapshot["instances"] if i["name"] == "reranker"))

    assert state(served.d.status()) == "stopped"  # on demand: the first request starts it and waits
    r = served.post("/v1/rerank", {"model": "reranker", "query": QUERY, "documents": TEXTS,
                                   "return_documents": True}, timeout=300)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True) and len(results) == len(TEXTS)
    for x in results:
        assert x["relevance_score"] == pytest.approx(served.ref["reranker"][x["index"]],
                                                     abs=1e-5)
        assert x["document"] == {"text": TEXTS[x["index"]]}
    top = served.post("/v1/rerank", {"model": "reranker", "query": QUERY,
                                     "documents": [{"text": t} for t in TEXTS], "top_n": 2})
    assert [x["index"] for x in top.json()["results"]] == [x["index"] for x in results[:2]]
    assert "document" not in top.json()["results"][0]
    served.d.watch_until(lambda s: state(s) == "stopped", what="the idle reranker stopped")


# ---- what each instance serves ----------------------------------------------------------------
def test_each_instance_serves_its_kind_and_says_so(served: Served) -> None:
    chat = served.post("/v1/chat/completions",
                       {"model": "bert", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and "serves embeddings" in chat.json()["error"]["message"]
    wrong = served.post("/v1/embeddings", {"model": "chat", "input": "hi"})
    assert wrong.status_code == 400 and "serves chat" in wrong.json()["error"]["message"]
    rerank = served.post("/v1/rerank", {"model": "bert", "query": "q", "documents": ["d"]})
    assert rerank.status_code == 400 and "serves embeddings" in rerank.json()["error"]["message"]
    models = {m["id"]: m for m in requests.get(served.url + "/v1/models", timeout=30).json()[
        "data"]}
    assert {k: m["serves"] for k, m in models.items()} == {
        "bert": "embeddings", "modernbert": "embeddings", "qwen3": "embeddings",
        "reranker": "rerank", "chat": "chat"}
    assert models["bert"]["dimensions"] == 64 and models["bert"]["max_input_tokens"] == 48
    assert models["bert"]["matryoshka_dimensions"] == [16, 32, 64]
    assert [i["state"] for i in served.d.status()["instances"] if i["name"] == "chat"] == \
        ["stopped"]  # never started by the refused request


# ---- bounds, cancellation, metrics --------------------------------------------------------------
def test_huge_inputs_are_answered_within_seconds(served: Served) -> None:
    t0 = time.monotonic()
    many = served.post("/v1/embeddings", {"model": "bert", "input": ["x"] * 100_000})
    assert many.status_code == 400 and many.json()["error"]["param"] == "input", many.text
    big = "word " * 2_000_000  # 10 MB: the runner reads a prefix of it only
    cut = served.post("/v1/embeddings", {"model": "bert", "input": big})
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == 48
    refused = served.post("/v1/embeddings", {"model": "bert", "input": big, "truncate": False})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input"
    assert time.monotonic() - t0 < 30


def test_an_abandoned_request_is_cancelled_in_the_runner(served: Served) -> None:
    def serving(s: dict[str, Any]) -> dict[str, Any]:
        """The runner's figures: none before its first report (this test run alone)."""
        found = next(i for i in s["instances"] if i["name"] == "qwen3")["serving"]
        return dict(found or {})

    def batched() -> int:
        return int((serving(served.d.status()).get("batches") or {}).get("inputs", 0))

    before = batched()
    inputs = [" ".join(f"w{i}x{k}" for k in range(300)) for i in range(2048)]
    body = json.dumps({"model": "qwen3", "input": inputs})
    parts = urlsplit(served.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
    served.d.watch_until(lambda s: serving(s).get("active") == 1, what="the request admitted")
    conn.close()  # the client leaves without reading the answer
    served.d.watch_until(lambda s: serving(s).get("active") == 0, what="the request dropped")
    assert batched() - before < 2048


def test_metrics_count_inputs_tokens_and_batches(served: Served) -> None:
    served.embed("modernbert", TEXTS)
    text = requests.get(served.url + "/metrics", timeout=30).text
    lines = {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in text.splitlines()
             if ln and not ln.startswith("#")}
    assert lines['exod_embedding_inputs_total{instance="modernbert"}'] >= len(TEXTS)
    assert lines['exod_embedding_batches_total{instance="modernbert"}'] >= 1
    assert lines['exod_embedding_batched_inputs_total{instance="modernbert"}'] >= len(TEXTS)
    assert lines['exod_prompt_tokens_total{instance="modernbert"}'] > len(TEXTS)
    assert lines['exod_requests_total{code="200",instance="modernbert"}'] >= 1
