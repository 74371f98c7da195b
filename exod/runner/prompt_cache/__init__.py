"""The prompt cache of a rank: KV caches of earlier prompts, kept in RAM and on disk.

Pure parts (no mlx, unit-tested alone): `index` (entries matched by their tokens, least recently
used out first, by bytes), `entry_file` (one entry as a safetensors file, written atomically and
checked on read), `fingerprint` (what makes a stored KV valid), `worker` (the I/O thread) and
`disk` (the disk tier: a folder per fingerprint, written and read on worker threads). The mlx
parts: `snapshot` (a cache as tensors and back, in mlx-lm's own prompt cache format) and `tiers`
(the two tiers together, as the batch engine uses them).
"""
