"""Model preparation for `exod run --demo`: the demo model converter (`demo`) and its file
plumbing (`_io`).

With exod.runner, the only package allowed to import mlx, mlx_lm and tokenizers; it does so
inside the functions that build models, so importing its modules (or a cached run of its CLI)
stays cheap. The daemon never imports it: it runs `python -m exod.models.demo`. The test and
benchmark model generators live in tests/models/, outside the package.
"""
