"""What an instance serves, told by its model's own files: vectors (an embedding model), relevance
scores (a cross-encoder reranker), or text (chat and completions). Never by a list of names.

- A reranker: config.json's `architectures` name a `...ForSequenceClassification` head with one
  label (a cross-encoder: query and document in, one relevance logit out).
- An embedding model: sentence-transformers' `modules.json` lists a Pooling module; or its
  `architectures` are a bare encoder (`BertModel`, `XLMRobertaModel`: a base model with no head,
  whose only use is its hidden states).
- Anything else is a chat model (mlx-lm's runner, or the vision runner for a model that sees).

How vectors are made comes from the same files (pooling, normalisation, a Dense head, the
longest input, the vector's size and the sizes it may be cut to): docs/embeddings.md, "What an
instance serves: the model's own files". Both kinds run on mlx-vlm's encoder models (the extra
`exod[vision]`; exod.runner.embed serves them), but this module reads files only: the daemon
and the CLI never import mlx-vlm.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from exod.facts.model_dir import config_json

Kind = Literal["embed", "rerank"]  # what an encoder model serves
Role = Literal["chat", "embed", "rerank"]
# What each role answers, as errors and /v1/models say it.
ENDPOINTS: dict[Role, str] = {
    "chat": "chat and completions (/v1/chat/completions, /v1/completions, /v1/messages, "
            "/v1/responses)",
    "embed": "embeddings (/v1/embeddings)",
    "rerank": "reranking (/v1/rerank)",
}
# sentence-transformers' legacy pooling flags, and the mode each names.
LEGACY_MODES = {
    "pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken",
}
POOLING_MODES = ("cls", "mean", "max", "lasttoken")  # what mlx-vlm's pool_by_config computes
DEFAULT_MAX_TOKENS = 512  # when no file tells: BERT's position table
SANE_LENGTH = 1_000_000  # tokenizers say 1e30 for "no limit"


@dataclass(frozen=True)
class Encoding:
    """An embedding or reranker model, as its files describe it."""

    role: Kind
    why: str  # which file told
    # sentence-transformers' pooling ({"pooling_mode": ...}); None: the family's own (mlx-vlm's
    # model default), for a bare encoder without modules.json.
    pooling: dict[str, Any] | None = None
    normalize: bool = True  # a Normalize module (or the family's own head, which normalizes)
    head: bool = False  # Dense modules after pooling: the family's model applies them
    max_tokens: int = DEFAULT_MAX_TOKENS  # the longest input, special tokens included
    dimensions: int | None = None  # the vector's size (1 for a reranker's score)
    # The sizes a vector may be cut to (`dimensions`): a tuple of them, "any" (up to the full
    # size), or None (the model was not trained for it).
    matryoshka: tuple[int, ...] | Literal["any"] | None = None
    problem: str | None = None  # why exod cannot serve it as it is

    def cut(self, size: int) -> str | None:
        """Why a vector of this model may not be cut to `size` (None: it may)."""
        full = self.dimensions
        if self.role != "embed":
            return "a reranker gives scores, not vectors"
        if full is not None and size >= full:
            return None if size == full else f"the model's vectors have {full} dimensions"
        if self.matryoshka is None:
            return ("the model was not trained for shorter vectors (its config.json has no "
                    "`matryoshka_dimensions`)")
        if self.matryoshka != "any" and size not in self.matryoshka:
            sizes = ", ".join(map(str, self.matryoshka))
            return f"the model was trained for these sizes only: {sizes}"
        return None


def role(model_dir: Path) -> Role:
    """What an instance of this model serves."""
    enc = encoding(model_dir)
    return "chat" if enc is None else enc.role


def encoding(model_dir: Path) -> Encoding | None:
    """The model as an embedding or reranker model; None for a chat model (or unreadable)."""
    config = config_json(model_dir)
    if config is None:
        return None
    listed = config.get("architectures")
    arch = [a for a in listed if isinstance(a, str)] if isinstance(listed, list) else []
    modules = _modules(model_dir)
    length = _max_tokens(model_dir, config)
    if any(a.endswith("ForSequenceClassification") for a in arch):
        labels = _labels(config)
        problem = None if labels == 1 else (
            f"a sequence classifier with {labels} labels is not a reranker (a cross-encoder has "
            "one relevance label)")
        return Encoding("rerank", f"its architecture {arch[0]} scores a query with a document",
                        pooling=None, max_tokens=length, dimensions=1, problem=problem)
    pooling_dir = next((p for t, p in modules if t.endswith(".Pooling")), None)
    bare = bool(arch) and all(a.endswith("Model") and "For" not in a for a in arch)
    if pooling_dir is None and not bare:
        return None
    kinds = [t.rsplit(".", 1)[-1] for t, _ in modules]
    head = "Dense" in kinds
    normalize = "Normalize" in kinds or not modules or head
    problem = None
    pooling = None
    if pooling_dir is not None:
        pooling, problem = _pooling(model_dir / pooling_dir)
        why = "its modules.json (sentence-transformers) pools it into vectors"
    else:
        why = f"its architecture {arch[0]} is an encoder without a head"
    if head and "Normalize" not in kinds:
        problem = problem or ("its Dense module's output is not normalized, which mlx-vlm's "
                              "model of it always does")
    return Encoding("embed", why, pooling=pooling, normalize=normalize, head=head,
                    max_tokens=length, dimensions=_dimensions(model_dir, config, modules),
                    matryoshka=_matryoshka(config), problem=problem)


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _modules(model_dir: Path) -> list[tuple[str, str]]:
    """(type, path) of each sentence-transformers module, in order; [] without modules.json."""
    raw = _read(model_dir / "modules.json")
    if not isinstance(raw, list):
        return []
    return [(str(m.get("type", "")), str(m.get("path", ""))) for m in raw
            if isinstance(m, dict) and ".." not in str(m.get("path", ""))]


def _pooling(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The Pooling module's mode as {"pooling_mode": mode} (mlx-vlm's form), or why not."""
    raw = _read(folder / "config.json")
    if not isinstance(raw, dict):
        return None, f"{folder / 'config.json'} cannot be read"
    mode = raw.get("pooling_mode")
    if mode is None:
        on = [name for key, name in LEGACY_MODES.items() if raw.get(key) is True]
        mode = on[0] if len(on) == 1 else (on or ["mean"])
    if raw.get("include_prompt", True) is False:
        return None, "its pooling leaves the prompt out (include_prompt: false), which exod " \
                     "does not do"
    if not isinstance(mode, str):
        return None, f"its pooling joins several modes ({', '.join(map(str, mode))}), which " \
                     "exod does not do"
    if mode not in POOLING_MODES:
        return None, f"its pooling mode {mode!r} is not one exod computes " \
                     f"({', '.join(POOLING_MODES)})"
    return {"pooling_mode": mode}, None


def _labels(config: dict[str, object]) -> int:
    n = config.get("num_labels")
    names = config.get("id2label")
    if not isinstance(n, int) and isinstance(names, dict):
        n = len(names)
    return n if isinstance(n, int) and n > 0 else 1


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


def _max_tokens(model_dir: Path, config: dict[str, object]) -> int:
    """The longest input the model takes: the least of what its files say."""
    found: list[int] = []
    sbert = _read(model_dir / "sentence_bert_config.json")
    if isinstance(sbert, dict) and _positive(sbert.get("max_seq_length")):
        found.append(sbert["max_seq_length"])
    tok = _read(model_dir / "tokenizer_config.json")
    if isinstance(tok, dict):
        n = tok.get("model_max_length")
        if isinstance(n, (int, float)) and not isinstance(n, bool) and 0 < n < SANE_LENGTH:
            found.append(int(n))
    positions = _positive(config.get("max_position_embeddings"))
    if positions is not None:
        # RoBERTa's positions start after the padding id: two entries of its table are unused.
        offset = (_positive(config.get("pad_token_id")) or 0) + 1 \
            if "roberta" in str(config.get("model_type", "")) else 0
        found.append(max(1, positions - offset))
    return min(found) if found else DEFAULT_MAX_TOKENS


def _dimensions(model_dir: Path, config: dict[str, object],
                modules: list[tuple[str, str]]) -> int | None:
    size = None
    for kind, path in modules:
        raw = _read(model_dir / path / "config.json")
        if not isinstance(raw, dict):
            continue
        if kind.endswith(".Dense"):
            size = _positive(raw.get("out_features")) or size
        elif kind.endswith(".Pooling"):
            size = _positive(raw.get("word_embedding_dimension")) or size
    return size or _positive(config.get("hidden_size"))


def _matryoshka(config: dict[str, object]) -> tuple[int, ...] | Literal["any"] | None:
    sizes = config.get("matryoshka_dimensions")
    if isinstance(sizes, list) and sizes and all(_positive(s) for s in sizes):
        return tuple(sorted({int(s) for s in sizes}))
    return "any" if config.get("is_matryoshka") is True else None
