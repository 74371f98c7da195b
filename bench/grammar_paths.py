"""Where a grammar's mask goes, in process: one 8-row batch of mlx-lm's BatchGenerator on
bench.agent_constrained's model, each row of a schema of bench.agent_constrained.cases.

- sampler / free: the masks added by the batch's one sampler, a step's masks computed at once
  while the forward runs (exod.runner.serving.batch_sampler, what the batch engine does);
- processor / free: the grammar as each row's logits processor (what a request asking for
  logprobs gets, and what every request got before);
- no grammar work / free: the sampler path with llguidance taken out (every token allowed): what
  the path itself costs, the masks' CPU aside;
- the masks' matrix (what the sampler adds to the batch's logprobs, made on the masks' worker
  thread while the forward runs) for 8 constrained rows: from the masks' bytes by one table
  lookup (exod.runner.serving.mask_round) against unpacking each row's bits and choosing
  between 0 and -inf (what it did before), the same rows timed beside each other.

Every row has a logit bias (end of sequence away, as in bench.agent_constrained), so the free
baseline takes mlx-lm's per-row processor path too. Runs back to back in one process, the free
baseline beside each; the figure is the median of the per-round ratios (EXOD_BENCH_ROUNDS), with
their range. Run alone with `python -m bench grammar_paths`; `python -m bench agent` runs it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import PY, REPO, report

ROWS, TOKENS = 8, 128
ROUNDS = int(os.environ.get("EXOD_BENCH_ROUNDS", "4"))
SIDES = ("sampler", "processor", "no grammar work")


def measure_here(model_dir: str) -> None:
    """Prints, as JSON: {case: {side: [ratio per round]}}."""
    from exod.runner.cpu import blas

    blas.preload()  # before mlx, as in the runner
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import greedy_sampler

    from bench.agent_constrained import cases
    from exod.config.schema import GrammarLimits
    from exod.runner.serving import grammar, mask_round
    from exod.runner.serving.batch_sampler import BatchSampler, generator_rows
    from exod.runner.serving.prepare import bias_processors

    model, tok = load(model_dir)
    model.set_dtype(mx.float32)  # as the runner runs on CPU
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    grammars = grammar.Grammars(tok, vocab, GrammarLimits())
    masks = mask_round.MaskRound()
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Tell me about {c} cats."}],
                                       add_generation_prompt=True) for c in range(1, ROWS + 1)]
    real_fill = mask_round.MaskRound._fill

    def run(fmt: dict[str, Any] | None, side: str = "") -> float:
        mask_round.MaskRound._fill = (  # type: ignore[method-assign]
            (lambda self, live, rows, shape: real_fill(self, [], rows, shape))
            if side == "no grammar work" else real_fill)
        gen = BatchGenerator(model, max_tokens=TOKENS, stop_tokens=set())
        where = generator_rows(gen)
        assert where is not None
        batch = BatchSampler(masks, where)
        procs, rows = [], []
        for _ in range(ROWS):
            p, c = bias_processors({"2": -100.0}, vocab), None
            if fmt is not None:
                c = grammars.json_schema({**fmt, "schema": fmt.get("json_schema", {}).get(
                    "schema")})
                if side == "no grammar work":
                    c.advance = lambda token: True  # type: ignore[method-assign]
                if side == "processor":
                    p.append(c)
            procs.append(p)
            rows.append(c if side != "processor" else None)
        by_sampler = fmt is not None and side != "processor"
        samplers = [batch if by_sampler else greedy_sampler] * ROWS
        uids = gen.insert(prompts, max_tokens=[TOKENS] * ROWS, logits_processors=procs,
                          samplers=samplers)
        for uid, c in zip(uids, rows, strict=True):
            batch.add(uid, greedy_sampler, c)
        n, t0 = 0, 0.0
        while n < ROWS * (TOKENS - 2):
            batch.begin()
            _, out = gen.next()
            if out and not t0:  # from the first token on: the decode steps only
                t0, n = time.perf_counter(), 0
            n += len(out)
        return n / (time.perf_counter() - t0)

    formats = [c.side["response_format"] for c in cases() if "response_format" in c.side]
    for fmt in formats[:2]:  # warm: mlx's kernels, the grammars' lexers
        run(fmt, "sampler")
    out: dict[str, dict[str, list[float]]] = {}
    for case in cases():
        fmt = case.side.get("response_format")
        if fmt is None:
            continue
        got: dict[str, list[float]] = {side: [] for side in SIDES}
        for r in range(ROUNDS):
            for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                free = run(None)
                got[side].append(run(fmt, side) / free)
        out[case.name] = got
    out["matrix"] = matrix_costs(grammars, formats[0])
    print(json.dumps(out))


def matrix_costs(grammars: Any, fmt: dict[str, Any]) -> dict[str, list[float]]:
    """Seconds to make one step's matrix of ROWS constrained rows, each way, per round."""
    import numpy as np

    from exod.runner.serving import mask_round

    rows = [(e, grammars.json_schema({**fmt, "schema": fmt["json_schema"]["schema"]}))
            for e in range(ROWS)]
    shape = (ROWS, grammars.vocab)

    def unpacked() -> np.ndarray:
        matrix = np.zeros(shape, dtype=np.float32)
        for e, c in rows:
            c._unpack()
            matrix[e] = c.padded(shape[-1])
        return matrix

    assert np.array_equal(unpacked(), mask_round._bias(rows, shape))
    got: dict[str, list[float]] = {"lookup": [], "unpack": []}
    for _ in range(ROUNDS):
        for name, fn in (("lookup", lambda: mask_round._bias(rows, shape)),
                         ("unpack", unpacked)):
            t = time.perf_counter()
            for _ in range(200):
                fn()
            got[name].append((time.perf_counter() - t) / 200)
    return got


def main() -> None:
    from bench.agent_constrained import bench_model

    with tempfile.TemporaryDirectory(prefix="bench-grammar-") as tmp:
        model = bench_model(Path(tmp))
        code = f"from bench.grammar_paths import measure_here; measure_here({str(model)!r})"
        res = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True,
                             cwd=REPO)
    got: dict[str, dict[str, list[float]]] = json.loads(res.stdout.strip().splitlines()[-1])
    matrix = got.pop("matrix")
    ratios = [a / b for a, b in zip(matrix["lookup"], matrix["unpack"], strict=True)]
    rows = [(f"the masks' matrix, {ROWS} rows: byte lookup / per-row unpack",
             f"{statistics.median(ratios):.3f}x ({statistics.median(matrix['lookup']) * 1e3:.2f}"
             f" ms / {statistics.median(matrix['unpack']) * 1e3:.2f} ms)")]
    for name, sides in got.items():
        for side, ratios in sides.items():
            rows.append((f"{name}, {side} / free ({ROWS} rows)",
                         f"{statistics.median(ratios):.3f}x (rounds {min(ratios):.3f}-"
                         f"{max(ratios):.3f})"))
    report("agent: a grammar's mask by the sampler or by a processor, in process", rows)


if __name__ == "__main__":
    main()
