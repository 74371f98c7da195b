"""Formats that write arguments in a literal syntax of their own, not JSON: Gemma 4's
(`call:NAME{key:<|"|>text<|"|>,n:1}`), FunctionGemma's (`<escape>` strings) and the pythonic one
(LFM2: `[NAME(key="text", n=1)]`).

Calls are forced by one converter: a tool's parameters, bounded as every grammar exod builds
from a JSON schema is (exod.runner.serving.json_bounds), walked into Lark rules that write each
value in the format's syntax. What the converter cannot write is, for a strict tool, the
request's error (400, `tools`), and for a lenient one the free value. Numbers are written as
JSON writes them (every one of these syntaxes reads a JSON number), so a bounded number is the
engine's own (`%json`).

Its parts: `syntax` (how a literal syntax writes JSON values, and the rules of one grammar),
`writer` (the converter) and `formats` (the three formats, each a call's head and closing around
the converter's arguments). The formats' table: docs/tools.md, "Formats".
"""

from __future__ import annotations

from exod.runner.formats.base import ToolFormat
from exod.runner.formats.literals.formats import FunctionGemma, Gemma4, Pythonic

__all__ = ["KINDS", "FunctionGemma", "Gemma4", "Pythonic"]

# mlx-lm's parser module -> the class that forces calls in that format.
KINDS: dict[str, type[ToolFormat]] = {"gemma4": Gemma4, "function_gemma": FunctionGemma,
                                      "pythonic": Pythonic}
