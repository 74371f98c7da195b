"""Model generators for tests and benchmarks, kept out of the shipped package: `tiny` (small
deterministic llama models and their tokenizer) and `zoo` (one tiny model per mlx-lm family,
configs in `zoo_families`). Each is runnable from the checkout as `python -m tests.models.NAME`.
They import mlx, mlx_lm and tokenizers only inside the functions that build models, so the test
process can import their constants and `corrupt_model` without them.
"""
