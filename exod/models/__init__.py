"""Model preparation: a tiny deterministic test model (`tiny`) and the demo model (`demo`).

With exod.runner, the only package allowed to import mlx, mlx_lm and tokenizers; it does so
inside the functions that build models, so importing its modules (or a cached run of their
CLIs) stays cheap. The daemon never imports it: it runs `python -m exod.models.demo`.
"""
