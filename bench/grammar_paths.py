"""Where a grammar's mask goes, in process: one 8-row batch of mlx-lm's BatchGenerator on
bench.agent_constrained's model, each row of a schema of bench.agent_constrained.cases.

- sampler / free: the masks applied by the batch's one sampler, a step's masks computed at once
  while mlx runs the step (exod.runner.serving.batch_sampler, what the batch engine does);
- processor / free: the grammar as each row's logits processor (what a request asking for
  logprobs gets, and what every request got before);
- no grammar work / free: the sampler path with llguidance taken out (every token allowed): what
  the path itself costs, the masks' CPU aside;
- sampler, masks as a matrix / free: the same, the masks applied as a float matrix made with
  numpy and added (what it did before the compiled kernel of exod.runner.serving.mask_round,
  which reads llguidance's words beside the logprobs).
- the kernel alone, 8 rows of the vocabulary: its time with scattered bits (half the tokens
  allowed, at random, as inside a JSON string) against none set but one (as at a grammar's
  structural tokens), and the same for a select (`mx.where`, the kernel until 2026-12-04),
  whose time on a CPU depends on the bits: it branches on each element.

Every row has a logit bias (end of sequence away, as in bench.agent_constrained), so the free
baseline takes mlx-lm's per-row processor path too. The sides are paired: one generator each,
stepped in turn, BLOCK steps at a time (and the order turned every block), so that each block's
ratio compares sides measured within milliseconds of each other; this machine's speed moves
over seconds, which a run per side turned into its figures. The figure is the median of
the blocks' ratios over EXOD_BENCH_ROUNDS rounds, with their interquartile range. Run alone with
`python -m bench grammar_paths`; `python -m bench agent` runs it.
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
from bench.results import Figure

ROWS, TOKENS, BLOCK = 8, 128, 8
ROUNDS = int(os.environ.get("EXOD_BENCH_ROUNDS", "4"))
SIDES = ("sampler", "sampler, masks as a matrix", "processor", "no grammar work")


def measure_here(model_dir: str) -> None:
    """Prints, as JSON: {case: {side: [ratio per block]}}."""
    from exod.runner.cpu import blas

    blas.preload()  # before mlx, as in the runner
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import greedy_sampler

    from bench.agent_constrained import cases
    from exod.wire.options import GrammarLimits
    from exod.runner.serving import grammar, mask_round
    from exod.runner.serving.batch_sampler import BatchSampler, generator_rows
    from exod.runner.serving.prepare import bias_processors

    model, tok = load(model_dir)
    model.set_dtype(mx.float32)  # as the runner runs on CPU
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    grammars = grammar.Grammars(tok, vocab, GrammarLimits())
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Tell me about {c} cats."}],
                                       add_generation_prompt=True) for c in range(1, ROWS + 1)]

    class NoWork(mask_round.MaskRound):
        def _fill(self, live: list[Any]) -> None:
            pass

    def matrix() -> mask_round.MaskRound:
        masks = mask_round.MaskRound()
        masks._kernel[mx.float32] = False  # as if the kernel had failed its check
        return masks

    rounds = {"no grammar work": NoWork, "sampler, masks as a matrix": matrix}

    def start(fmt: dict[str, Any] | None, side: str) -> tuple[Any, BatchSampler | None]:
        gen = BatchGenerator(model, max_tokens=TOKENS, stop_tokens=set())
        where = generator_rows(gen)
        assert where is not None
        batch = BatchSampler(rounds.get(side, mask_round.MaskRound)(), where)
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
        return gen, (batch if by_sampler else None)

    def steps(gen: Any, batch: BatchSampler | None, n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            if batch is not None:
                batch.begin()
            gen.next()
        mx.synchronize()
        return time.perf_counter() - t

    def paired(fmt: dict[str, Any]) -> dict[str, list[float]]:
        """One round: every side and the free baseline stepped in turn, a block at a time."""
        gens = {"free": start(None, ""), **{side: start(fmt, side) for side in SIDES}}
        for gen, batch in gens.values():
            steps(gen, batch, 3)  # the prompts read, and the first tokens
        order = list(gens)
        got: dict[str, list[float]] = {side: [] for side in SIDES}
        for _ in range((TOKENS - 8) // BLOCK):
            order = order[1:] + order[:1]
            took = {name: steps(*gens[name], BLOCK) for name in order}
            for side in SIDES:
                got[side].append(took["free"] / took[side])
        return got

    formats = [c.side["response_format"] for c in cases() if "response_format" in c.side]
    paired(formats[0])  # warm: mlx's kernels, the grammars' lexers
    out: dict[str, Any] = {}
    for case in cases():
        fmt = case.side.get("response_format")
        if fmt is None:
            continue
        got: dict[str, list[float]] = {side: [] for side in SIDES}
        for _ in range(ROUNDS):
            for side, ratios in paired(fmt).items():
                got[side] += ratios
        out[case.name] = got
    print(json.dumps({"paths": out, "kernel": kernel_times(width=vocab)}))


def kernel_times(width: int, rows: int = ROWS, n: int = 200) -> dict[str, float]:
    """Median seconds of the masks' kernel (mask_round._allowed) and of a select over `rows`
    logprobs of `width`, with scattered bits and with one bit set a row."""
    import mlx.core as mx
    import numpy as np

    from exod.runner.serving import mask_round

    select = mx.compile(lambda lp, w, s: mx.where(((w >> s) & 1).astype(mx.bool_), lp, -mx.inf))
    rng = np.random.default_rng(0)
    width -= width % 32
    logprobs = mx.array(rng.normal(size=(rows, width // 32, 32)).astype(np.float32))
    bits = {"scattered": rng.integers(0, 2, size=(rows, width), dtype=np.uint8),
            "one": np.eye(1, width, 7, dtype=np.uint8).repeat(rows, axis=0)}
    out = {}
    for name, kernel in (("kernel", mask_round._allowed), ("select", select)):
        for which, b in bits.items():
            words = mx.array(np.packbits(b, axis=1, bitorder="little").view(np.uint32))[:, :, None]
            mx.eval(logprobs, words)
            took = []
            for _ in range(n):
                t = time.perf_counter()
                mx.eval(kernel(logprobs, words, mask_round._SHIFTS))
                took.append(time.perf_counter() - t)
            out[f"{name} {which}"] = statistics.median(took)
    return out


def main() -> None:
    from bench.agent_constrained import bench_model

    with tempfile.TemporaryDirectory(prefix="bench-grammar-") as tmp:
        model = bench_model(Path(tmp))
        code = f"from bench.grammar_paths import measure_here; measure_here({str(model)!r})"
        res = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True,
                             cwd=REPO)
    printed = json.loads(res.stdout.strip().splitlines()[-1])
    got: dict[str, dict[str, list[float]]] = printed["paths"]
    k: dict[str, float] = printed["kernel"]
    rows: list[Figure] = []
    for name, sides in got.items():
        for side, ratios in sides.items():
            q = statistics.quantiles(ratios, n=4)
            rows.append(Figure(f"{name}, {side} / free ({ROWS} rows)", statistics.median(ratios),
                               low=q[0], high=q[2], text="range: the blocks' middle half"))
    for name in ("kernel", "select"):
        rows.append(Figure(f"masks' {name}, {ROWS} rows: scattered bits / one bit a row",
                           k[name + " scattered"] / k[name + " one"],
                           sides={"scattered": k[name + " scattered"] * 1e3,
                                  "one": k[name + " one"] * 1e3}, side_unit="ms"))
    rows.append(Figure("masks' kernel / select, scattered bits",
                       k["kernel scattered"] / k["select scattered"]))
    report("agent: a grammar's mask by the sampler or by a processor, in process", rows)


if __name__ == "__main__":
    main()
