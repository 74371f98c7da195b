"""mlx-lm's generation options of an instance (quantized KV cache, rotating cache, speculative
decoding, LoRA adapters, the wired-memory limit): what goes with what, and what each layout can
take. Pure functions of a validated `Instance` and config.json; no mlx.

Nothing is accepted that would be ignored: a key that only means something beside another one
is refused alone, and a combination mlx-lm cannot run is refused with the reason.
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from pathlib import Path

from exod.config.checks import Issue
from exod.facts.model_dir import model_config, model_limits
from exod.config.schema import Instance
from exod.wire.options import RunnerOptions

ADAPTER_FILES = ("adapter_config.json", "adapters.safetensors")  # what mlx_lm.lora writes

CACHE_KEYS = ("prompt_cache_bytes", "prompt_cache_disk_bytes", "warm")
# Which key needs which: written alone it would change nothing.
_NEEDS = {"kv_group_size": "kv_bits", "quantized_kv_start": "kv_bits",
          "num_draft_tokens": "draft_model"}

# Why a group cannot take each option: its ranks replay one batch engine in step
# (exod.runner.group.lockstep), and the runner loads adapters and drafts only whole.
_NOT_IN_A_GROUP = {
    "kv_bits": "the quantized batch (exod.runner.serving.quantized_batch) is served by one rank "
               "only so far: a group's ranks make their caches layer range by layer range",
    "draft_model": "the ranks of a group replay rank 0's batch in step, and a speculative step "
                   "(the draft's forwards, each row's accepted tokens and rewinds) is not part "
                   "of what they replay",
    "adapters": "LoRA adapters are applied to a whole model (mlx_lm.server refuses them in "
                "distributed mode too)",
    "max_kv_size": "a group's ranks make their caches layer range by layer range; a rotating "
                   "cache is not supported there yet",
}


def turn_reason(instance: RunnerOptions) -> str | None:
    """Why the instance serves by turns (one token of each request in turn) rather than in one
    batch, when an option of its own decides it; None otherwise. Its runner decides so by this
    same rule, from the options in its spec."""
    if instance.draft_model is not None and instance.kv_bits is not None:
        return ("speculative decoding with a quantized KV cache (draft_model with kv_bits): the "
                "batch rewinds the rows of a float cache only")
    return None


def idle_cache_keys(instance: Instance) -> tuple[tuple[str, ...], str] | None:
    """The prompt cache's keys that change nothing for this instance, and why; None when each
    has its effect (or the model is not fetched yet, and what it is not known)."""
    turns = turn_reason(instance)
    if turns is not None:
        return CACHE_KEYS, f"the instance serves by turns ({turns}), which keeps no prompt cache"
    if instance.hub is not None:
        return None
    from exod.facts.embed import encoding
    from exod.facts.vision import sees

    if encoding(instance.model) is not None:
        return CACHE_KEYS, "an embedding model or a reranker keeps no prompt cache"
    if sees(instance.model) is not None:
        return CACHE_KEYS[1:], ("a model that sees keeps its prompt cache in RAM only (no disk "
                                "tier, no warm prompts yet)")
    return None


def check_mlx_options(instance: Instance, written: Collection[str],
                      platform: str = sys.platform) -> list[Issue]:
    issues = [Issue(key, f"applies only with `{needs}` (it would change nothing alone)")
              for key, needs in _NEEDS.items() if key in written and needs not in written]
    keys, why = idle_cache_keys(instance) or ((), "")
    for key in keys:
        if key in written and getattr(instance, key):
            issues.append(Issue(key, f"has no effect here: {why}; remove it"
                                     + ("" if key == "warm" else " (or write 0)")))
    if instance.kv_bits is not None and instance.max_kv_size is not None:
        issues.append(Issue("max_kv_size", "cannot go with kv_bits: mlx-lm cannot quantize a "
                                           "rotating cache (RotatingKVCache); choose one"))
    if instance.draft_model is not None and instance.max_kv_size is not None:
        issues.append(Issue("max_kv_size", "cannot go with draft_model: speculative decoding "
                                           "rewinds the cache after a rejected draft, which a "
                                           "full rotating cache cannot (mlx-lm drops max_kv_size "
                                           "with a draft model)"))
    if instance.shards > 1:
        issues += [Issue(key, f"not with shards > 1: {why}; serve it with one rank")
                   for key, why in _NOT_IN_A_GROUP.items() if getattr(instance, key) is not None]
    if instance.kv_bits is not None and instance.hub is None:
        dim = head_dim(instance.model)
        if dim is not None and dim % instance.kv_group_size:
            issues.append(Issue("kv_group_size" if "kv_group_size" in written else "kv_bits",
                                f"kv_group_size {instance.kv_group_size} does not divide the "
                                f"model's head dimension {dim}: mlx quantizes a head's values "
                                "in whole groups (set kv_group_size to one that divides it)"))
    if instance.draft_model is not None and instance.draft_hub is None and instance.hub is None:
        problem = draft_vocab_problem(instance.model, instance.draft_model)
        if problem:
            issues.append(Issue("draft_model", problem))
    if instance.adapters is not None:
        problem = adapters_problem(instance.adapters)
        if problem:
            issues.append(Issue("adapters", problem))
    if instance.wired_limit is not None and platform != "darwin":
        issues.append(Issue("wired_limit", "applies only on macOS (Metal's wired memory); this "
                                           f"system ({platform}) has none: remove it"))
    return issues


def head_dim(model_dir: Path) -> int | None:
    cfg = model_config(model_dir)
    explicit = cfg.get("head_dim")
    if isinstance(explicit, int) and not isinstance(explicit, bool) and explicit > 0:
        return explicit
    hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads == 0:
        return hidden // heads
    return None


def draft_vocab_problem(model: Path, draft: Path) -> str | None:
    """A draft must speak the model's token ids, or every draft is rejected (or out of range)."""
    ours, theirs = model_limits(model)[0], model_limits(draft)[0]
    if ours is not None and theirs is not None and ours != theirs:
        return (f"its vocabulary ({theirs} tokens) is not the model's ({ours}): a draft model "
                "must share the model's tokenizer")
    return None


def adapters_problem(folder: Path) -> str | None:
    try:
        if not folder.is_dir():
            return f"{folder} is not a directory (an adapter folder, as mlx_lm.lora writes it)"
        missing = [name for name in ADAPTER_FILES if not (folder / name).is_file()]
    except OSError as e:
        return f"cannot read {folder}: {e.strerror or e}"
    if missing:
        return f"{folder} has no {' or '.join(missing)} (as mlx_lm.lora writes them)"
    return None


def describe(instance: Instance) -> list[str]:
    """`exod check`'s words for the options an instance sets."""
    parts: list[str] = []
    if instance.kv_bits is not None:
        parts.append(f"KV cache {instance.kv_bits}-bit (group {instance.kv_group_size}, from "
                     f"token {instance.quantized_kv_start})")
    if instance.max_kv_size is not None:
        parts.append(f"rotating KV cache of {instance.max_kv_size} tokens")
    if instance.draft_model is not None:
        parts.append(f"speculative decoding with {instance.draft_hub or instance.draft_model}, "
                     f"{instance.num_draft_tokens} draft tokens a step")
    if instance.adapters is not None:
        parts.append(f"LoRA adapters {instance.adapters}")
    if instance.wired_limit is not None:
        parts.append(f"wired limit {instance.wired_limit} bytes")
    if not parts:
        return []
    why = turn_reason(instance)
    tail = f"; serves requests by turns, not batched: {why}" if why else ""
    return [f"{instance.name}: {'; '.join(parts)}{tail}"]
