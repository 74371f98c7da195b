"""What the runner reads from the model as loaded, for the request rules
(exod.core.request_rules) to check against: the real width of its logits, its embedding rows,
its context window. The daemon checks requests against the model's config.json; the runner
checks them again with these numbers, so that no token id and no position can index outside a
table, whatever sent the request. mlx does not check indices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exod.core import request_rules as rules

__all__ = ["bias_processor", "context_window", "greedy_temperature", "model_vocab"]

# 1 / temperature past this overflows float32: the scaled logits would be inf and NaN.
_MAX_SCALE = 3.0e38


# Where model configs give the context window (as exod.facts.model_dir reads config.json).
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
            rules.bias_ids(ids, width)
            checked[:] = [width]
        return logits.at[:, index].add(values)

    return process
