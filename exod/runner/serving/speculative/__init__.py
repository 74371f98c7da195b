"""Speculative decoding inside the continuous batch: with `draft_model`, every request in the
batch engine's batch is drafted and checked at each step (docs/api.md, "Speculative decoding").

- `generator`: mlx-lm's BatchGenerator, made on the model and its draft as one (`pair`), whose
  rows are decoded by a `batch.SpeculativeBatch`;
- `accept`: what a row keeps of a step (mlx-lm's rule, pure), `rewind`: rows of a batch's
  caches taken back by their own counts.

Exact: each token is the model's own sample, so greedy rows give the model's greedy tokens and
sampling rows its distribution, with its logprobs. A row with a grammar, a seed or a logits
processor that keeps a state is decoded in the same batch without speculating
(`batch.own_sampler`).

Why the draft's cache is stored in the prompt cache beside the model's: a hit then skips the
draft's prefill too, which on a long agent prompt is the draft's whole prefill again; it costs
the draft's share of the bytes (its layers and heads against the model's).
"""

from exod.runner.serving.speculative.generator import SpeculativeGenerator, why_not

__all__ = ["SpeculativeGenerator", "why_not"]
