"""exod's tests. Every process that imports them (pytest's workers, the own-process checks,
`python -m tests.models.*`) reads transformers' lazy import table from exod's cache, as runners
do (exod.runner.start.import_table): each such process that imports mlx_lm builds it otherwise."""

from exod.runner.start import import_table

import_table.install()
