"""The last check before anything of a request touches mlx: the daemon validates requests
against the model's config.json, and this checks again against the model as loaded (the real
width of its logits, its embedding rows, its context window), so that no token id and no
position can index outside a table, whatever sent the request. mlx does not check indices.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from exod.runner.serving.loop import RequestError

__all__ = ["RequestError", "bias_processor", "check_ids", "context_window", "fit_window",
           "greedy_temperature", "logit_bias", "max_tokens", "model_vocab", "prompt_ids",
           "unit_number"]

_TOKEN_ID = re.compile(r"[0-9]{1,10}")
# 1 / temperature past this overflows float32: the scaled logits would be inf and NaN.
_MAX_SCALE = 3.0e38


def logit_bias(raw: Any) -> dict[int, float]:
    """`logit_bias` as token id → finite bias in [-100, 100]; RequestError otherwise."""
    if not raw:
        return {}
    if not isinstance(raw, Mapping):
        raise RequestError("logit_bias must map token ids to numbers", "logit_bias")
    out: dict[int, float] = {}
    for k, v in raw.items():
        if not (isinstance(k, str) and _TOKEN_ID.fullmatch(k)):
            raise RequestError(f"logit_bias: {k!r} is not a token id", "logit_bias")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or not -100 <= v <= 100:
            raise RequestError(f"logit_bias[{k}]: must be a number from -100 to 100",
                               "logit_bias")
        out[int(k)] = float(v)
    return out


def check_ids(ids: list[int], width: int) -> None:
    """Every id must index the logits (`width` wide)."""
    bad = [i for i in ids if not 0 <= i < width]
    if bad:
        raise RequestError(f"logit_bias: token id {bad[0]} is outside the model's vocabulary "
                           f"(ids 0 to {width - 1})", "logit_bias")


def max_tokens(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise RequestError("max_tokens must be an integer of at least 1", "max_tokens")
    return raw


def prompt_ids(ids: list[int], vocab: int, param: str) -> None:
    """Every prompt token must index the embedding table (`vocab` rows): a tokenizer may know
    more tokens (added ones) than the model has rows, and a client can spell them."""
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise RequestError(f"the prompt holds token id {bad[0]}, outside the model's vocabulary "
                           f"(ids 0 to {vocab - 1})", param)


def fit_window(prompt: int, max_tokens: int, window: int | None, param: str) -> int:
    """The tokens a request may generate: no position may pass the model's context window,
    where a learned position table (gpt2's) would be read out of bounds. A prompt that fills
    the window is refused; a generation that would pass it ends there (finish reason
    `length`)."""
    if window is None:
        return max_tokens
    if prompt >= window:
        raise RequestError(f"the prompt is {prompt} tokens: it must leave room for one token "
                           f"in the model's context window of {window}", param)
    return min(max_tokens, window - prompt)


# Where model configs give the context window (as exod.config.model_dir reads config.json).
_WINDOW_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length",
                "max_sequence_length")


def context_window(model: Any) -> int | None:
    """The positions the model takes, from its arguments; None when they do not say. A RoPE
    scaling factor stretches the window (a checkpoint run past its trained length on purpose);
    a learned position table (gpt2's) has none, and its rows are the hard limit."""
    args = getattr(model, "args", None)  # mlx-lm's ModelArgs: a dataclass, or a dict inside
    for obj in (args, getattr(args, "text_config", None)):
        n = next((v for v in (_arg(obj, k) for k in _WINDOW_KEYS) if _positive(v)), None)
        if n is not None:
            scaling = _arg(obj, "rope_scaling")
            factor = scaling.get("factor") if isinstance(scaling, dict) else None
            stretch = factor if isinstance(factor, (int, float)) and 1 < factor < 1e6 else 1
            return int(n * stretch)
    return None


def model_vocab(model: Any) -> int | None:
    """Rows of the model's logits and embeddings, from its arguments (a multimodal model's
    under `text_config`); None when they do not say."""
    args = getattr(model, "args", None)
    found = (_arg(args, "vocab_size"), _arg(_arg(args, "text_config"), "vocab_size"),
             getattr(model, "vocab", None))
    return next((n for n in found if _positive(n)), None)


def _arg(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _positive(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def greedy_temperature(temperature: float) -> bool:
    """0, or so small that 1 / temperature overflows float32 (its limit is greedy anyway)."""
    return temperature <= 0 or 1.0 / temperature > _MAX_SCALE


def unit_number(raw: Any, name: str, default: float, hi: float) -> float:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) \
            or not 0 <= raw <= hi:
        raise RequestError(f"{name} must be a number from 0 to {hi:g}", name)
    return float(raw)


def bias_processor(bias: dict[int, float]) -> Callable[[Any, Any], Any]:
    """A logits processor adding `bias`, that first checks the ids against the logits it is
    given: the real width of the model's output, not what a config file claims."""
    import mlx.core as mx

    ids = sorted(bias)
    values = mx.array([bias[i] for i in ids])
    index = mx.array(ids)
    checked: list[int] = []

    def process(_tokens: Any, logits: Any) -> Any:
        width = int(logits.shape[-1])
        if not checked or checked[0] != width:
            check_ids(ids, width)
            checked[:] = [width]
        return logits.at[:, index].add(values)

    return process
