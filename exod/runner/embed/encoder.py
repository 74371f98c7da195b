"""One forward pass of an embedding model or a reranker over a batch of inputs, and what comes
out of it as the model's files say (exod.facts.embed.Encoding): an embedding pooled, cut for
`dimensions` (Matryoshka: its first values) and normalized where the model normalizes; a
reranker's one relevance logit per pair through a sigmoid (a score from 0 to 1, as mlx-vlm's
server and Cohere's API give it).

The inputs are padded on the right to the longest, with an attention mask: an encoder ignores
the padding through the mask, and a decoder (Qwen3-Embedding's causal attention) never attends
forward, so its positions are those of the input alone and its last real token is the one
pooled. Each input's vector is therefore its vector alone, whatever it is batched with (up to
float rounding), which tests/integration/test_embeddings.py checks.

On a CPU a step's parts (exod.runner.embed.engine.split) run at once, a thread per core, with
OpenBLAS's threads shared out among them; a part that runs alone computes its activations on
every core (exod.runner.cpu.split). Why: docs/embeddings.md, Batching; docs/design/runner-cpu.md.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import mlx.core as mx

from exod.facts.embed import Encoding
from exod.runner.cpu import blas, split
from exod.runner.embed.part import Part


def threads() -> int:
    """Threads that compute a step: the cores this process may run on (its affinity: a
    service's CPUAffinity, taskset) on a CPU; one where mlx computes on a GPU."""
    return split.cores() if mx.default_device() == mx.cpu else 1


class Encoder:
    def __init__(self, model: Any, enc: Encoding, pad_id: int, threads: int = 1) -> None:
        self.model = model
        self.enc = enc
        self.pad_id = pad_id
        self.threads = threads
        self.pool = ThreadPoolExecutor(threads - 1, thread_name_prefix="encode") \
            if threads > 1 else None
        self.blas = self.blas_all = blas.threads() or 1
        self.split = split.install(model, threads)

    def run_all(self, parts: list[Part]) -> list[list[bytes]]:
        """Each part's results (`run`), the parts computed at once: the first on this thread,
        the others on the pool's."""
        self._share_blas(len(parts))
        if self.pool is None or len(parts) == 1:
            with self._cores(self.threads):
                return [self.run(*p) for p in parts]
        later = [self.pool.submit(self.run, *p) for p in parts[1:]]
        try:
            first = self.run(*parts[0])
        finally:  # a failed part still waits for the others: the next step starts on idle cores
            wait(later)
        return [first, *(f.result() for f in later)]

    def _cores(self, n: int) -> AbstractContextManager[None]:
        return self.split.splitter.cores(n) if self.split is not None else nullcontext()

    def _share_blas(self, parts: int) -> None:
        """OpenBLAS's threads shared out among passes that run at once: with a thread per
        core in each, BLAS threads outnumber the cores and those that wait spin."""
        want = max(1, self.blas_all // parts)
        if want != self.blas:
            blas.set_threads(want)
            self.blas = want

    def run(self, ids: list[list[int]], types: list[list[int]] | None,
            dimensions: list[int | None]) -> list[bytes]:
        """Each input's result, as float32 bytes in the machine's order (a vector cut to its
        request's `dimensions`, or a score)."""
        width = max(map(len, ids))
        padded = mx.array([s + [self.pad_id] * (width - len(s)) for s in ids], dtype=mx.int32)
        mask = mx.array([[1] * len(s) + [0] * (width - len(s)) for s in ids], dtype=mx.int32)
        kwargs: dict[str, Any] = {"attention_mask": mask}
        if types is not None:
            kwargs["token_type_ids"] = mx.array([t + [0] * (width - len(t)) for t in types],
                                                dtype=mx.int32)
        out = self.model(padded, **kwargs)
        if self.enc.role == "rerank":
            logits = getattr(out, "logits", out)
            scores = mx.sigmoid(logits.reshape(len(ids), -1)[:, 0]).astype(mx.float32)
            mx.eval(scores)
            return [_bytes(scores[i:i + 1]) for i in range(len(ids))]
        vectors = self._vectors(out, mask)
        rows = []
        for i, size in enumerate(dimensions):
            row = vectors[i] if size is None else vectors[i, :size]
            if size is not None and self.enc.normalize:
                row = row / mx.maximum(mx.linalg.norm(row), 1e-12)
            rows.append(row.astype(mx.float32))
        mx.eval(rows)
        return [_bytes(r) for r in rows]

    def _vectors(self, out: Any, mask: mx.array) -> mx.array:
        if self.enc.normalize or self.enc.pooling is None:
            return out.text_embeds  # pooled (with the configured mode) and normalized
        from mlx_vlm.models.pooling import pool_by_config

        return pool_by_config(out.last_hidden_state, mask, self.enc.pooling)


def _bytes(a: mx.array) -> bytes:
    return bytes(memoryview(cast(Any, a)))  # an mx.array is a buffer (evaluated on access)
