"""Model generators for tests and benchmarks, kept out of the shipped package: `tiny` (small
deterministic llama models and their tokenizer) and `zoo` (one tiny model per mlx-lm family,
configs in `zoo_families`). Both run from the checkout: `python -m tests.models.tiny OUT`,
`python -m tests.models.zoo ROOT [FAMILY[:BITS]...]`.
They import mlx, mlx_lm and tokenizers only inside the functions that build models, so the test
process can import their constants and `corrupt_model` without them.
"""
