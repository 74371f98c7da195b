"""exod: local mlx-lm inference as a supervised operating-system service."""

__version__ = "0.1.0"
