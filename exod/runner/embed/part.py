"""What one forward pass of the encoder computes, as the engine hands it over: a module of its
own because the engine (pure, no mlx) builds parts and the encoder (mlx) runs them, and neither
may import the other."""

from __future__ import annotations

from typing import NamedTuple


class Part(NamedTuple):
    """Inputs that run in one forward pass: their token ids, their pairs' type ids (a
    reranker's, or None), and each one's vector size (its request's `dimensions`)."""

    ids: list[list[int]]
    types: list[list[int]] | None
    dimensions: list[int | None]
