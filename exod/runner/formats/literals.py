"""Formats that write arguments in a literal syntax of their own: Gemma 4's
(`call:NAME{key:<|"|>text<|"|>,n:1}`), FunctionGemma's (`<escape>` strings) and the pythonic one
(LFM2: `[NAME(key="text", n=1)]`).
"""

from __future__ import annotations

from exod.runner.formats.base import ToolFormat

# mlx-lm's parser module -> the class that forces calls in that format.
KINDS: dict[str, type[ToolFormat]] = {}
