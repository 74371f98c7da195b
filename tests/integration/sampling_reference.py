"""What mlx-lm itself generates for sampling settings, and what exod's two engines generate
for them in-process: run by tests/integration/test_sampling.py in a subprocess of its own, so
the test process never imports mlx.

    python tests/integration/sampling_reference.py MODEL_DIR CASES_JSON

CASES_JSON: a list of {"prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p",
"seed", "logit_bias", "repetition_penalty", "repetition_context_size", "presence_penalty",
"frequency_penalty"} (omitted: off). Prints one JSON object: {"mlx": [text...], "batch":
[text...] (every case in one batch at once), "turns": [text...] (exod's turn engine)}.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import mlx.core as mx
import mlx_lm
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from exod.wire import messages as m
from exod.runner.serving.batch_engine import BatchEngine
from exod.runner.serving.turn_engine import TurnEngine

PENALTIES = ("repetition_penalty", "repetition_context_size", "presence_penalty",
             "frequency_penalty")


def mlx_text(model: Any, tokenizer: Any, case: dict[str, Any]) -> str:
    """mlx-lm's generate with make_sampler and make_logits_processors; a seed as mx.random.seed."""
    mx.random.seed(case.get("seed", 0))
    sampler = make_sampler(temp=case.get("temperature", 0.0), top_p=case.get("top_p", 0.0),
                           min_p=case.get("min_p", 0.0), top_k=case.get("top_k", 0))
    bias = {int(k): float(v) for k, v in case.get("logit_bias", {}).items()}
    processors = make_logits_processors(bias, **{k: case[k] for k in PENALTIES if k in case})
    return str(mlx_lm.generate(model, tokenizer, case["prompt"], max_tokens=case["max_tokens"],
                               sampler=sampler, logits_processors=processors))


def request(i: int, case: dict[str, Any]) -> m.Generate:
    return m.Generate(id=str(i), kind="completion", **{"temperature": 0.0, **case})


def exod_texts(engine: Any, cases: list[dict[str, Any]]) -> list[str]:
    reqs = [request(i, c) for i, c in enumerate(cases)]
    for r in reqs:
        engine.admit(r, engine.read(r))
    texts = [""] * len(reqs)
    while engine.active:
        for ev in engine.step():
            if isinstance(ev, m.Error):
                raise RuntimeError(ev.message)
            if isinstance(ev, m.Text):
                texts[int(ev.id)] += ev.text
    return texts


def main() -> None:
    model, tokenizer = mlx_lm.load(sys.argv[1])
    cases = json.loads(sys.argv[2])
    out = {"mlx": [mlx_text(model, tokenizer, c) for c in cases],
           "batch": exod_texts(BatchEngine(model, tokenizer, width=len(cases), cache_bytes=0),
                               cases),
           "turns": exod_texts(TurnEngine(model, tokenizer, len(cases), 256, "test"), cases)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
