"""What cutting activations and attention's heads a slice per core buys on the CPU
(exod.runner.cpu.split, exod.runner.cpu.attention), float32 with OpenBLAS, each figure whole /
cut (above 1.0 the cut is faster):

1. In process, the two taking turns (ABBA) on one loaded model, the thread allowed 1 core, then
   2, each side of a round at least 3 calls and ~1.5 s: a forward pass of the demo model over
   a 512-token prompt (its 30 gated MLPs, mlx-lm's swiglu, and its attention; the pass also
   computes the output layer at every position, which a served prefill skips, so the served
   gain is larger); a picture request of `bench vision`'s mid-sized Qwen2.5-VL (tower and
   language model); one input of `bench embeddings`' MiniLM-shaped BERT (its GELUs and
   attention, a pass alone). The results must be bitwise the same (logits, vectors).
2. Served: one daemon with two instances of the demo model, one with EXOD_SPLIT=0, one client's
   requests going to each in turn: time to answer one token of a ~750-token prompt (no disk tier
   on either: an idle instance writes its entries, which took CPU from the other's prefill).

Each figure is the median of per-round ratios, with their range. `python -m bench split`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time

import requests

from bench.api import demo_model
from bench.common import PY, REPO, report
from bench.results import Figure
from bench.embeddings import bench_model as embed_model
from bench.embeddings import text as embed_text
from bench.vision import vision_model
from tests.harness import Daemon

ROUNDS = 6
SERVED_ROUNDS = 8

IN_PROCESS = r"""
import json, statistics, sys, time
from exod.runner.cpu.blas import preload
preload()
import mlx.core as mx
from exod.runner.cpu import split

text_path, vision_path, embed_path, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
embed_input = json.loads(sys.argv[5])

def text():
    from mlx_lm import load
    model, _ = load(text_path)
    model.set_dtype(mx.float32)
    ids = mx.array([[(i * 37) % 5000 + 10 for i in range(512)]])
    return model, lambda: model(ids)

def vision():
    from mlx_vlm import apply_chat_template, load
    from mlx_vlm.utils import prepare_inputs
    from tests.models.vision_zoo import picture
    model, proc = load(vision_path)
    model.set_dtype(mx.float32)
    prompt = apply_chat_template(proc, model.config, [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "What is in the picture?"}]}], num_images=1)
    inp = prepare_inputs(proc, images=[picture(224, 224, seed=5)], prompts=[prompt])
    def run():
        emb = model.get_input_embeddings(inp["input_ids"], inp["pixel_values"],
                                         mask=inp["attention_mask"],
                                         image_grid_thw=inp["image_grid_thw"])
        extra = {k: v for k, v in emb.to_dict().items() if k != "inputs_embeds" and v is not None}
        return model.language_model(inp["input_ids"], inputs_embeds=emb.inputs_embeds,
                                    **extra).logits
    return model, run

def embed():
    from exod.facts.embed import encoding
    from exod.runner.embed.load import load_encoder
    from pathlib import Path
    enc = encoding(Path(embed_path))
    loaded = load_encoder(Path(embed_path), enc, dtype="float32", progress=lambda *_: None,
                          should_stop=lambda: False)
    ids = mx.array([loaded.tokenizer(embed_input, truncation=True)["input_ids"]])
    return loaded.model, lambda: loaded.model(ids, attention_mask=mx.ones_like(ids)).text_embeds

out = {}
for name, make in (("text", text), ("vision", vision), ("embed", embed)):
    model, run = make()
    want = run()
    mx.eval(want)
    done = split.install(model, 2)
    t = time.perf_counter()
    mx.eval(run())
    n = max(3, round(1.5 / (time.perf_counter() - t)))  # calls of ~1.5 s a side and round
    def timed(cores):
        done.splitter.allow(cores)
        mx.eval(run())
        t = time.perf_counter()
        for _ in range(n):
            got = run()
            mx.eval(got)
        return (time.perf_counter() - t) / n, got
    ratios = []
    for r in range(rounds):
        order = (1, 2) if r % 2 == 0 else (2, 1)
        got = {c: timed(c) for c in order}
        ratios.append(got[1][0] / got[2][0])
    same = bool(mx.array_equal(got[2][1], want).item())
    out[name] = {"ratios": ratios, "same": same, "whole_ms": got[1][0] * 1e3,
                 "what": done.describe()}
print(json.dumps(out))
"""


def in_process() -> dict[str, dict[str, object]]:
    res = subprocess.run([PY, "-c", IN_PROCESS, str(demo_model()), vision_model(),
                          str(embed_model()), str(ROUNDS), json.dumps(embed_text(7))],
                         capture_output=True, text=True, check=False, cwd=REPO)
    if res.returncode != 0:
        raise RuntimeError(f"the in-process part failed:\n{res.stderr[-3000:]}")
    got: dict[str, dict[str, object]] = json.loads(res.stdout.strip().splitlines()[-1])
    return got


def served() -> list[float]:
    """Per round: time to first token of the instance with EXOD_SPLIT=0 over the other's."""
    path = str(demo_model())
    # No disk tier: an idle instance writes its entries behind the requests, which would
    # take CPU from the other instance's prefill, in turns.
    quiet = {"model": path, "prompt_cache_disk_bytes": 0}
    d = Daemon({"ready": "instances", "instances": {
        "on": quiet, "off": {**quiet, "env": {"EXOD_SPLIT": "0"}}}}, name="bench-split")
    d.start()
    url = d.api_url()

    def ttft(model: str, i: int) -> float:
        """Seconds to answer one token (not streamed: a stream's first chunk comes before the
        prefill), a prompt of ~750 tokens no other request started with."""
        words = " ".join(f"item{(i * 7919 + k) % 5000}" for k in range(150))
        t0 = time.perf_counter()
        r = requests.post(url + "/v1/chat/completions", json={
            "model": model, "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "user", "content": f"{i} Summarize: {words}"}]}, timeout=600)
        r.raise_for_status()
        return time.perf_counter() - t0

    try:
        ttft("on", 0)
        ttft("off", 1)
        ratios = []
        for i in range(SERVED_ROUNDS):
            got = {m: ttft(m, 100 + 2 * i + (m == "on"))
                   for m in (("on", "off") if i % 2 == 0 else ("off", "on"))}
            ratios.append(got["off"] / got["on"])
        return ratios
    finally:
        d.close()


def main() -> None:
    got = in_process()
    rows: list[Figure] = []
    labels = {"text": "demo model, prefill of 512 tokens",
              "vision": "vision-mid, one 224x224 picture request (tower + prefill)",
              "embed": "MiniLM-shaped BERT, one input (48 tokens)"}
    for name, label in labels.items():
        r = got[name]
        ratios = r["ratios"]
        assert isinstance(ratios, list)
        rows.append(Figure(f"{label}: whole / cut", statistics.median(ratios), rounds=ratios,
                           goal=">= 1.0x"))
        rows.append(Figure(f"{label}: bitwise the same", None, met=bool(r["same"]),
                           text=f"{r['same']}; whole took {r['whole_ms']:.0f} ms"))
    s = served()
    rows.append(Figure("served: one token after a ~750-token prompt, off / on",
                       statistics.median(s), rounds=s, goal=">= 1.0x"))
    report("split: activations cut a slice per core vs whole (CPU, float32)", rows)


if __name__ == "__main__":
    main()
