"""The vision runner's engine against mlx-vlm's own, in one process, on a mid-sized random
Qwen2.5-VL made by the vision zoo (8 layers of width 512; an 8-layer tower of width 256 seeing
224x224 pictures: 256 patches, 64 image tokens), float32 with OpenBLAS:

1. Load: exod's (lazy, then the tower and each layer evaluated in turn, with progress) over
   mlx-vlm's eager `load`.
2. One request (a picture and a question, 64 tokens, greedy): tokens/s from the request to its
   last token, exod's VisionEngine over mlx-vlm's `stream_generate`; the tokens must be equal.
3. Four requests at once (four pictures): aggregate tokens/s, exod's engine batching them over
   mlx-vlm's `stream_generate` one after the other (its plain API; `bench vision` against its
   server, issue 31, is still to come).

The two sides take turns (ABBA) over ROUNDS rounds; each figure is the median of per-round
ratios, with their range. `python -m bench vision`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.common import CACHE, PY, REPO, report

ROUNDS = 4
SETS = {
    "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
    "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
    "vision_config/hidden_size": 256, "vision_config/depth": 8, "vision_config/num_heads": 4,
    "vision_config/intermediate_size": 1024, "vision_config/out_hidden_size": 512,
    "vision_config/fullatt_block_indexes": [3, 7],
    "@preprocessor_config.json/max_pixels": 224 * 224,
}

IN_PROCESS = r"""
import base64, io, json, sys, time
from pathlib import Path
from exod.runner.cpu.blas import preload
preload()
import mlx.core as mx
from mlx_vlm import apply_chat_template, load
from mlx_vlm.generate import stream_generate
from exod import messages as m
from exod.runner.vision.engine import VisionEngine
from exod.runner.vision.load import load_vision
from tests.models.vision_zoo import content, picture

path, rounds, n = Path(sys.argv[1]), int(sys.argv[2]), 64
PROMPT = "What is in the picture?"
pics = [picture(224, 224, seed=s) for s in range(4)]

def png(img):
    b = io.BytesIO(); img.save(b, "PNG"); return m.Image(base64.b64encode(b.getvalue()).decode())

def load_mlx():
    t = time.perf_counter(); model, proc = load(str(path)); model.set_dtype(mx.float32)
    mx.eval(model.parameters()); return time.perf_counter() - t, model, proc

def load_exod():
    t = time.perf_counter()
    lv = load_vision(path, dtype="auto", progress=lambda i, k: None, should_stop=lambda: False)
    return time.perf_counter() - t, lv

def mlx_one(model, proc, img):
    msgs = [{"role": "user", "content": content(PROMPT, 1)}]
    text = apply_chat_template(proc, model.config, msgs, num_images=1)
    t = time.perf_counter()
    *_, last = stream_generate(model, proc, text, image=[img], max_tokens=n, temperature=0.0)
    return time.perf_counter() - t, list(last.token_ids)

class Recording(VisionEngine):
    def __init__(self, *a, **k):
        super().__init__(*a, **k); self.tokens = {}
    def _on_token(self, r, resp):
        self.tokens.setdefault(r.rid, []).append(resp.token); return super()._on_token(r, resp)

def exod_run(lv, imgs):
    eng = Recording(lv.model, lv.processor, lv.tokenizer, width=len(imgs), prefill_step=512,
                    feature_bytes=0)
    reqs = [m.Generate(id=f"r{i}", kind="chat", max_tokens=n, temperature=0.0, images=[png(img)],
                       messages=[{"role": "user", "content": [{"type": "image", "image": 0},
                                                              {"type": "text", "text": PROMPT}]}])
            for i, img in enumerate(imgs)]
    t = time.perf_counter()
    for r in reqs:
        eng.admit(r, eng.read(r))
    done = set()
    while len(done) < len(reqs):
        done |= {e.id for e in eng.step() if isinstance(e, (m.Done, m.Error))}
    return time.perf_counter() - t, [eng.tokens[r.id] for r in reqs]

out = {"load": [], "one": [], "four": [], "equal": True}
_, model, proc = load_mlx()
_, lv = load_exod()
mlx_one(model, proc, pics[0]); exod_run(lv, pics[:1])  # warm both (kernels, caches)
for i in range(rounds):
    order = ["exod", "mlx"] if i % 2 == 0 else ["mlx", "exod"]
    got = {}
    for side in order:
        if side == "mlx":
            lt, model, proc = load_mlx()
            t1, ref = mlx_one(model, proc, pics[0])
            t4 = sum(mlx_one(model, proc, img)[0] for img in pics)
        else:
            lt, lv = load_exod()
            t1, toks = exod_run(lv, pics[:1])
            t4, _ = exod_run(lv, pics)
        got[side] = (lt, t1, t4)
    out["equal"] &= toks[0] == ref
    out["load"].append(got["mlx"][0] / got["exod"][0])
    out["one"].append(got["mlx"][1] / got["exod"][1])
    out["four"].append(got["mlx"][2] / got["exod"][2])
    out.setdefault("abs", []).append({k: [round(x, 3) for x in v] for k, v in got.items()})
print(json.dumps(out))
"""


def vision_model() -> str:
    sets = [f"--set={k}={json.dumps(v)}" for k, v in SETS.items()]
    res = subprocess.run([PY, "-m", "tests.models.vision_zoo", str(CACHE / "vision-mid"),
                          "qwen2_5_vl", *sets], capture_output=True, text=True, check=True,
                         cwd=REPO)
    made: dict[str, dict[str, str]] = json.loads(res.stdout.strip().splitlines()[-1])
    return made["qwen2_5_vl"]["path"]


def main() -> None:
    path = vision_model()
    res = subprocess.run([PY, "-c", IN_PROCESS, path, str(ROUNDS)], check=False,
                         capture_output=True,
                         text=True, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if res.returncode != 0:
        sys.exit(f"bench vision failed:\n{res.stderr[-3000:]}")
    got = json.loads(res.stdout.strip().splitlines()[-1])

    def ratio(xs: list[float]) -> str:
        xs = sorted(xs)
        return f"{xs[len(xs) // 2]:.2f}x (range {xs[0]:.2f}-{xs[-1]:.2f})"

    report("vision: exod's engine over mlx-vlm's, same process (higher is better for exod)", [
        ("load (mlx-vlm time / exod time)", ratio(got["load"])),
        ("one request, tokens/s", ratio(got["one"])),
        ("four requests, aggregate tokens/s", ratio(got["four"])),
        ("tokens equal mlx-vlm's", str(got["equal"])),
        ("seconds per round: load, one, four", json.dumps(got["abs"])),
    ])
