"""Serving defaults shared by the config schema (daemon side) and the runner's arguments."""

from __future__ import annotations

from typing import Final

# Stored KV caches of earlier requests, per instance: a 1k-token chat turn of the demo model
# (SmolLM2-135M, float32) holds ~46 MiB, of an 8B model in float16 ~128 MiB.
DEFAULT_PROMPT_CACHE_BYTES = 1 << 30

# The prompt cache's disk tier, per instance (on each rank of a group): a 3.5k-token agent
# prompt of the demo model holds ~160 MiB (float32 on a CPU), a 26k-token one of an 8B model in
# float16 ~3.2 GiB. Writes also leave the filesystem min(1 GiB, 5%) free.
DEFAULT_PROMPT_CACHE_DISK_BYTES = 8 << 30

# Prompt tokens prefilled in one engine step, over all prompts in flight. A stop or a cancel
# waits at most one step; on a 2-core CPU 256 tokens of the demo model take well under a
# second, and far less than the 5 s default drain.
DEFAULT_PREFILL_STEP = 256

# mlx-lm's own defaults for the options an instance may tune (mlx_lm.generate, mlx_lm.server).
DEFAULT_KV_GROUP_SIZE: Final = 64
DEFAULT_QUANTIZED_KV_START = 5000  # tokens in a cache before it is quantized
DEFAULT_NUM_DRAFT_TOKENS = 3  # mlx_lm.server's --num-draft-tokens

# An embedding model's engine (exod.runner.embed.engine): inputs x their longest length in one
# forward pass at most, and inputs in one batch at most. On a 2-core CPU a batch of 4096 tokens
# of a 100M-parameter encoder takes about a second; the matmuls gain little past it.
EMBED_BATCH_TOKENS = 4096
EMBED_MAX_BATCH = 64
