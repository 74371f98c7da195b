"""What the config needs to know about a model directory, read from config.json alone.

Never imports mlx or mlx_lm: the daemon and the CLI must stay light (the runner does the loading).
"""

from __future__ import annotations

import json
from pathlib import Path

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def model_dir_problem(model_dir: Path) -> str | None:
    """Why `model_dir` is not a usable mlx-lm model directory, or None when it looks fine."""
    try:
        if not model_dir.exists():
            return f"model directory {model_dir} does not exist"
        if not model_dir.is_dir():
            return f"model path {model_dir} is not a directory"
        config = model_dir / "config.json"
        if not config.is_file():
            return f"model directory {model_dir} has no config.json (is it an mlx-lm model?)"
        text = config.read_text(encoding="utf-8")
    except (OSError, ValueError) as e:  # permissions, name too long, NUL in the name…
        return f"cannot read model directory {model_dir}: {getattr(e, 'strerror', None) or e}"
    try:
        data = json.loads(text)
    except ValueError as e:
        return f"{config} is not valid JSON: {e}"
    if not isinstance(data, dict):
        return f"{config} does not hold a JSON object"
    return None


def config_json(model_dir: Path, name: str = "config.json") -> dict[str, object] | None:
    """config.json's object (or another JSON file's of the folder: `name`); None when
    unreadable. Tolerant on purpose: a missing or odd file is reported elsewhere
    (`model_dir_problem`)."""
    try:
        data = json.loads((model_dir / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def model_layer_count(model_dir: Path) -> int | None:
    """The model's number of transformer layers from config.json, or None if it cannot be told."""
    data = config_json(model_dir)
    if data is None:
        return None
    # Multimodal models nest the language model's settings.
    for section in (data, data.get("text_config"), data.get("language_config")):
        if isinstance(section, dict):
            for key in _LAYER_KEYS:
                n = section.get(key)
                if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                    return n
    return None


def model_config(model_dir: Path) -> dict[str, object]:
    """config.json as a dict (the language-model section for multimodal models).

    {} if unreadable."""
    data = config_json(model_dir)
    if data is None:
        return {}
    for key in ("text_config", "language_config"):
        section = data.get(key)
        if isinstance(section, dict) and "num_attention_heads" not in data:
            return {**section, "model_type": data.get("model_type")}
    return data


# Query heads only: every tensor split keeps whole heads on each rank. Key/value heads fewer
# than the ranks can still work (some families' shard() repeats them): the probe decides.
_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads")


def model_heads(model_dir: Path) -> tuple[str, int] | None:
    """(config.json key, count) of the model's attention heads, if config.json states it."""
    cfg = model_config(model_dir)
    n = positive_int(cfg, _HEAD_KEYS)
    return None if n is None else (next(k for k in _HEAD_KEYS if cfg.get(k) == n), n)


_VOCAB_KEYS = ("vocab_size", "n_vocab", "padded_vocab_size")
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len",
                 "seq_length", "max_sequence_length")


def positive_int(section: dict[str, object], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        n = section.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return None


def model_limits(model_dir: Path) -> tuple[int | None, int | None]:
    """(vocabulary size, context window) from config.json; None for what it does not say.
    What the API checks requests against, so that no token id outside the vocabulary and no
    `max_tokens` beyond the window ever reaches the runner."""
    cfg = model_config(model_dir)
    return positive_int(cfg, _VOCAB_KEYS), positive_int(cfg, _CONTEXT_KEYS)
