"""A text runner's prompt cache beyond RAM: its disk tier, opened before READY when that is
quick, and the instance's `warm:` prompts prefilled into it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from exod.runner.link.log import WARNING, log
from exod.runner.runner import Runner

if TYPE_CHECKING:
    from exod.runner.group.lockstep import LeaderEngine
    from exod.runner.load import Loaded
    from exod.runner.prompt_cache.disk import DiskTier
    from exod.runner.serving.batch_engine import BatchEngine

SETTLE_LIMIT = 60.0  # seconds READY waits at most for the disk tier to open (a hung mount)


def disk_tier(r: Runner, loaded: Loaded) -> DiskTier | None:
    """The prompt cache's disk tier of this rank, opening (on its own thread): its folder is
    named by everything that makes a stored KV valid (exod.runner.prompt_cache.fingerprint)."""
    import mlx.core as mx
    import mlx_lm

    from exod.runner.cpu import fused
    from exod.runner.prompt_cache import fingerprint as fp
    from exod.runner.prompt_cache.disk import DiskTier

    opts, folder = r.options, r.spec.prompt_cache_folder
    if folder is None or opts.prompt_cache_disk_bytes <= 0:
        return None
    shard = loaded.shard
    tier = DiskTier(folder, shard.rank, opts.prompt_cache_disk_bytes,
                    max_queued=max(256 << 20, opts.prompt_cache_bytes), solo=shard.world == 1)
    tier.open({"format": fp.FORMAT_VERSION, "dtype": loaded.dtype, "layers": shard.arg(),
               "total_layers": shard.total, "world": shard.world,
               "parallelism": r.spec.parallelism, "kv_bits": opts.kv_bits,
               "kv_group_size": opts.kv_group_size, "quantized_kv_start": opts.quantized_kv_start,
               "max_kv_size": opts.max_kv_size, "fused": fused.install(),
               "mlx": getattr(mx, "__version__", ""), "mlx_lm": mlx_lm.__version__},
              weights(r))
    r.life.on_stop(lambda: setattr(tier, "stopping", True))  # a long hash ends at a stop
    tier.on_change = lambda: r.channel.inbox.put(None)  # the loop wakes to report it
    return tier


def weights(r: Runner) -> dict[str, Path]:
    """The files an entry's KV comes from: the model's, and its draft's, whose cache is stored
    beside the model's (exod.runner.serving.speculative)."""
    from exod.runner.prompt_cache import fingerprint as fp

    files: dict[str, Path] = dict(fp.weight_files(r.spec.model, r.options.adapters))
    if r.options.draft_model is not None:
        draft = fp.weight_files(r.options.draft_model, None)
        files.update({f"draft/{name}": path for name, path in draft.items()})
    return files


def wait_settled(disk: DiskTier | None) -> None:
    """Before READY: let the disk tier open when that is quick (its weights' hashes are
    recorded), so the first request after a restart finds what was kept; a tier that must hash
    the weights first does it while the instance serves."""
    if disk is not None:
        disk.settled.wait(SETTLE_LIMIT)


def warm(r: Runner, engine: BatchEngine | LeaderEngine, tokenizer: Any) -> None:
    """The instance's `warm:` prompts into the prompt cache (prefilled as the loop steps): rank
    0's to do (the other ranks of a group replay what it decides)."""
    from exod.config.warm import read_warm
    from exod.runner.serving.prepare import chat_prompt

    for path in r.options.warm:
        try:
            got = read_warm(path)
            tokens = chat_prompt(tokenizer, got.messages, got.tools,
                                 dict(r.spec.chat_template_kwargs), answer=False)
        except Exception as e:  # noqa: BLE001 -- a template may raise anything: a log line
            log(f"warm: cannot use {path}: {type(e).__name__}: {e}", WARNING)
            continue
        if engine.warm(tokens):
            log(f"warm: prefilling {path} ({len(tokens)} tokens)")
        else:
            log(f"warm: {path} ({len(tokens)} tokens) is in the prompt cache already")
