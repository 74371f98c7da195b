"""Formats that write a call parameter by parameter between tags, strings as raw text and other
values as JSON: Qwen3-Coder's XML, GLM's `<arg_key>`/`<arg_value>` (and Laguna's, LongCat's),
MiniMax-M2's `<invoke>`, MiniCPM5's `<function name=...>`, Kimi K3's XTML, Muse Spark's.
"""

from __future__ import annotations

from exod.runner.formats.base import ToolFormat

# mlx-lm's parser module -> the class that forces calls in that format.
KINDS: dict[str, type[ToolFormat]] = {}
