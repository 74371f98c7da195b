"""A decode step's grammar masks, computed for every constrained row at once and applied to the
batch's logprobs in one pass (exod.runner.serving.batch_sampler calls `apply`).

As each row's logits processor, a grammar read the token just chosen as a new lazy op, queued
behind the forward the row before had started: the masks were computed one row after another
with the forward done and a core idle. Here, in order (docs/design/constrained-decoding.md):
1. the step's forward pass is handed to mlx first, behind the tokens chosen at the step before
   (kept by the batch sampler, already scheduled), so the model never waits on this thread;
2. each row consumes its token and llguidance's executor computes every row's next mask on this
   thread: on a CPU once the forward is done, while mlx runs the log-softmax (why:
   exod.runner.serving.logits_tap); on a GPU, below SOFTMAX_COVERS, or where the log-softmax's
   input is not caught, beside the whole step;
3. one compiled kernel (`_allowed`) reads llguidance's words (a bit a token, 4 bytes a 32 tokens
   to copy into mlx) and masks the logprobs in one pass; a vocabulary not a multiple of 32 wide,
   or a kernel not bitwise the float matrix (`_added`) at its first call, keeps the matrix.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

import llguidance
import mlx.core as mx
import numpy as np

from exod.runner.link.log import WARNING, log

Sampler = Callable[[mx.array], mx.array]  # mlx-lm's: logprobs in, tokens out
FREE = np.uint32(0xFFFFFFFF)  # a free row's words: every token allowed
# The masks wait for the forward pass and go beside the log-softmax only when it has at least
# this many logits (4 rows of a 49k vocabulary): the wait leaves the next step's graph to be
# built after the forward, which a short log-softmax does not cover. At 1 client not waiting is
# the better, at 8 waiting (docs/design/constrained-decoding.md).
SOFTMAX_COVERS = 4 * 49152


# The same name as exod.runner.serving.grammar.Constraint, which it describes: the round needs
# only these parts, and no grammar compiler.
class Constraint(Protocol):
    """What the round needs of a row's grammar (exod.runner.serving.grammar.Constraint)."""

    matcher: llguidance.LLMatcher
    words: np.ndarray  # the mask's words, as llguidance writes them
    def advance(self, token: int) -> bool: ...

    def filled(self, words: np.ndarray) -> None: ...


class MaskRound:
    """One per engine, used from the thread that steps the batch (the serve loop's)."""

    def __init__(self, threads: int = max(1, (os.cpu_count() or 2) - 1)) -> None:
        # A core is left to mlx's stream, which runs the log-softmax meanwhile on one thread.
        self._threads = threads
        self._executor: llguidance.LLExecutor | None = None  # made at the first constrained row
        self._kernel: dict[mx.Dtype, bool] = {}  # by logprobs dtype: the kernel checked good

    def apply(self, last: list[tuple[mx.array, list[tuple[int, Constraint]]]],
              rows: list[tuple[int, Constraint]], logprobs: mx.array,
              logits: mx.array | None = None) -> mx.array:
        """`logprobs` with the masks of `rows` (by their place in the batch) applied: -inf
        where a row's grammar refuses the token. `last`: the tokens chosen since, each with the
        constrained rows by their place then: each row consumes its token first. `logits`: what
        `logprobs` normalises (exod.runner.serving.logits_tap, on a CPU), or None."""
        if logits is not None and logits.size < SOFTMAX_COVERS:
            logits = None  # a short log-softmax: the masks go beside the whole step
        if logits is not None:  # its own event: waited for below, the log-softmax queued behind
            mx.async_eval(logits)
        mx.async_eval(logprobs)
        mx.eval([chosen for chosen, _ in last])
        live: list[Constraint] = []
        for chosen, before in last:
            tokens = np.asarray(chosen).reshape(-1)  # no new op: nothing queued behind the step
            live += [c for e, c in before if c.advance(int(tokens[e]))]
        if logits is not None:  # the masks go beside the log-softmax, not the matmuls
            mx.eval(logits)
        if live:  # also when the rows just read are free: the others' masks are still due
            self._fill(live)
        return self._masked(rows, logprobs) if rows else logprobs

    def _fill(self, live: list[Constraint]) -> None:
        words = live[0].words.size
        out = np.zeros((len(live), words), dtype=np.uint32)
        if self._executor is None:
            self._executor = llguidance.LLExecutor(self._threads)
        self._executor.unsafe_compute_mask_ptr(
            [(c.matcher, i) for i, c in enumerate(live)], out.ctypes.data, words * 4, len(live))
        for i, c in enumerate(live):
            c.filled(out[i])

    def _masked(self, rows: list[tuple[int, Constraint]], logprobs: mx.array) -> mx.array:
        n, width = logprobs.shape
        words = np.full((n, -(-width // 32)), FREE, dtype=np.uint32)
        for e, c in rows:
            mask = c.words[:words.shape[1]]
            words[e, :mask.size] = mask
            words[e, mask.size:] = 0  # a wider output layer's padding: never allowed
        good = self._kernel.get(logprobs.dtype)
        if width % 32 or good is False:
            return _added(logprobs, words)
        if good:
            return _kept(logprobs, words)
        return self._check(logprobs, words)

    def _check(self, logprobs: mx.array, words: np.ndarray) -> mx.array:
        """The kernel's first call for a dtype: kept only if every logprob agrees with the
        matrix's sum (-inf where refused, the logprob itself elsewhere). Either way the sum is
        what this step gets."""
        reference = _added(logprobs, words)
        try:
            mine = _kept(logprobs, words)
            same = mine.dtype == reference.dtype and bool(mx.array_equal(mine, reference).item())
            reason = "its result differs"
        except Exception as e:  # noqa: BLE001 -- any failure means the matrix, said once
            same, reason = False, f"{type(e).__name__}: {e}"
        self._kernel[logprobs.dtype] = same
        if not same:
            log(f"grammar masks: the compiled kernel is not used for {logprobs.dtype} ({reason});"
                " masks are added as a matrix", WARNING)
        return reference


def _kept(logprobs: mx.array, words: np.ndarray) -> mx.array:
    """The masks applied by the kernel (a width that is a multiple of 32)."""
    n, width = logprobs.shape
    return _allowed(logprobs.reshape(n, width // 32, 32), mx.array(words)[:, :, None],
                    _SHIFTS).reshape(n, width)


def _added(logprobs: mx.array, words: np.ndarray) -> mx.array:
    """The masks applied as a matrix added to the logprobs."""
    return logprobs + mx.array(_matrix(words, logprobs.shape[-1])).astype(logprobs.dtype)


_SHIFTS = mx.arange(32, dtype=mx.uint32)


@mx.compile
def _allowed(logprobs: mx.array, words: mx.array, shifts: mx.array) -> mx.array:
    """logprobs (rows, n, 32) where bit i of words (rows, n, 1) is set, -inf elsewhere: one
    fused elementwise kernel, the same for every shape (it has none of its own). A minimum with
    +inf (kept) or -inf (refused), not a select: mlx's select on a CPU branches on each element,
    and a grammar's allowed tokens lie scattered over the vocabulary (inside a JSON string,
    every token without a quote or backslash), so the branch mispredicts: several times slower
    with scattered bits than with none set, where the minimum takes the same time whatever the
    bits (`python -m bench grammar_paths`; docs/benchmarks.md). The result is the matrix's sum
    for every logprob but +inf (refused: -inf here, NaN there) and the sign of a zero, neither
    of which a log-softmax gives."""
    bound = (((words >> shifts) & 1).astype(mx.float32) * 2 - 1) * mx.inf  # +inf or -inf
    return mx.minimum(logprobs, bound.astype(logprobs.dtype))


# Byte value -> the 8 floats it stands for (bit i: token 8k+i, little-endian as llguidance writes).
_BYTES = np.where(np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1,
                                bitorder="little").astype(np.bool_),
                  np.float32(0), np.float32(-np.inf)).astype(np.float32)


def _matrix(words: np.ndarray, width: int) -> np.ndarray:
    """The masks as a matrix to add: 0 where a row's word allows the token, -inf elsewhere.
    Made from the words' bytes by one lookup (each byte picks its 8 floats from a table of
    256 rows): cheaper than unpacking each row's bits and choosing between 0 and -inf
    (docs/benchmarks.md, `grammar_paths`)."""
    packed = words.view(np.uint8)
    out = np.empty((*packed.shape, 8), dtype=np.float32)
    np.take(_BYTES, packed, axis=0, out=out)
    return out.reshape(packed.shape[0], -1)[:, :width]
