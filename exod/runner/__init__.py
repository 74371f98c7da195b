"""The runner: one child process per rank. The only part of exod that imports mlx / mlx_lm."""
