"""In-process mlx-lm for tests/integration/test_mlx_options.py, in a subprocess of its own (the
test process never imports mlx): makes a tiny LoRA adapter with mlx-lm's own LoRA layers and
saving, and prints what mlx-lm itself generates with each option.

    python tests/integration/mlx_options_reference.py MODEL_DIR ADAPTER_OUT CASE_JSON

CASE_JSON: {"prompt", "max_tokens", "logit_bias", "kv_bits", "kv_group_size", "max_kv_size",
"kv_prompts"}.
Prints one JSON object: greedy texts "plain", "kv" (kv_bits from token 0), "kv_many" (the same
for each of "kv_prompts"), "rotating"
(max_kv_size, generate_step), "rotating_batch" (two at once in BatchGenerator), "lora" (the
adapter), and the chosen tokens' logprobs "plain_logprobs",
"kv_logprobs", "rotating_logprobs".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
from mlx.utils import tree_flatten
from mlx_lm.generate import BatchGenerator, generate_step
from mlx_lm.models.cache import RotatingKVCache
from mlx_lm.sample_utils import make_logits_processors
from mlx_lm.tuner.utils import linear_to_lora_layers
from mlx_lm.utils import save_config

LORA = {"rank": 4, "scale": 20.0, "dropout": 0.0}


def make_adapter(model_dir: str, out: Path, seed: int = 7) -> None:
    """LoRA layers on the last 2 blocks, with lora_b made non-zero (a fresh one is zero, which
    would change nothing), saved as mlx_lm.lora saves them. Another `seed`: other values."""
    model, _ = mlx_lm.load(model_dir)
    model.freeze()
    linear_to_lora_layers(model, 2, LORA)
    mx.random.seed(seed)
    weights = {p: (mx.random.normal(v.shape) * 0.5 if p.endswith("lora_b") else v)
               for p, v in tree_flatten(model.trainable_parameters())}
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), weights)
    save_config({"fine_tune_type": "lora", "num_layers": 2, "lora_parameters": LORA},
                out / "adapter_config.json")


def greedy(model: Any, tokenizer: Any, case: dict[str, Any], **kw: Any
           ) -> tuple[str, list[float]]:
    prompt = mx.array(tokenizer.encode(kw.pop("prompt", case["prompt"])))
    processors = make_logits_processors({int(k): v for k, v in case["logit_bias"].items()})
    tokens, logprobs = [], []
    for token, lp in generate_step(prompt, model, max_tokens=case["max_tokens"],
                                   logits_processors=processors, **kw):
        tokens.append(int(token))
        logprobs.append(float(lp[int(token)]))
    return text_of(tokenizer, tokens), logprobs


def text_of(tokenizer: Any, tokens: list[int]) -> str:
    detokenizer = tokenizer.detokenizer  # the text as mlx-lm's stream_generate makes it
    detokenizer.reset()
    for token in tokens:
        detokenizer.add_token(token)
    detokenizer.finalize()
    return str(detokenizer.text)


def batched(model: Any, tokenizer: Any, case: dict[str, Any], n: int) -> list[str]:
    """`n` greedy generations at once in mlx-lm's BatchGenerator (as mlx_lm.server batches),
    each with a rotating cache of max_kv_size."""
    prompt = tokenizer.encode(case["prompt"])
    processors = make_logits_processors({int(k): v for k, v in case["logit_bias"].items()})
    gen = BatchGenerator(model, stop_tokens=[[t] for t in tokenizer.eos_token_ids],
                         completion_batch_size=n, prefill_batch_size=n)
    uids = gen.insert([prompt] * n, max_tokens=[case["max_tokens"]] * n,
                      caches=[rotating(model, case) for _ in range(n)],
                      logits_processors=[processors] * n)
    tokens: dict[int, list[int]] = {u: [] for u in uids}
    done: set[int] = set()
    while len(done) < n:
        for resp in gen.next()[1]:
            tokens[resp.uid].append(int(resp.token))
            if resp.finish_reason is not None:
                done.add(resp.uid)
    return [text_of(tokenizer, tokens[u]) for u in uids]


def rotating(model: Any, case: dict[str, Any]) -> list[Any]:
    """mlx-lm's rotating cache, as make_prompt_cache(model, max_kv_size) makes it for a family
    without a make_cache of its own (llama has one, which max_kv_size does not change)."""
    return [RotatingKVCache(max_size=case["max_kv_size"], keep=4) for _ in model.layers]


def main() -> None:
    model_dir, adapter, case = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    make_adapter(model_dir, adapter)
    model, tokenizer = mlx_lm.load(model_dir)
    plain, plain_lp = greedy(model, tokenizer, case)
    kv, kv_lp = greedy(model, tokenizer, case, kv_bits=case["kv_bits"],
                       kv_group_size=case["kv_group_size"], quantized_kv_start=0)
    kv_many = [greedy(model, tokenizer, case, prompt=p, kv_bits=case["kv_bits"],
                      kv_group_size=case["kv_group_size"], quantized_kv_start=0)[0]
               for p in case["kv_prompts"]]
    rotated, rotated_lp = greedy(model, tokenizer, case, prompt_cache=rotating(model, case))
    lora_model, _ = mlx_lm.load(model_dir, adapter_path=str(adapter))
    lora, _ = greedy(lora_model, tokenizer, case)
    print(json.dumps({"plain": plain, "kv": kv, "kv_many": kv_many, "rotating": rotated,
                      "lora": lora,
                      "rotating_batch": batched(model, tokenizer, case, 2),
                      "plain_logprobs": plain_lp, "kv_logprobs": kv_lp,
                      "rotating_logprobs": rotated_lp}))


if __name__ == "__main__":
    main()
