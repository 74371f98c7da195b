"""Formats that write a call parameter by parameter between tags, strings as raw text and other
values as JSON: Qwen3-Coder's XML, GLM's `<arg_key>`/`<arg_value>` (and Laguna's, LongCat's),
MiniMax-M2's `<invoke>`, MiniCPM5's `<function name=...>`, Kimi K3's XTML, Muse Spark's.

A value is written as its template writes it; a string inside a union with other types (`anyOf`
a string and a number) is JSON-quoted, since raw no parser could tell it from a number. Forced
calls are read back exactly: mlx-lm's parsers (0.32) strip string values, read `null` as None
whatever the type, and read strings that look like JSON as JSON, so these formats read the
values themselves, by the tool's schema (`Tagged.read`); mlx-lm's parser still reads what they
do not recognise (GLM's JSON-shaped calls), and Kimi K3's, whose arguments name their types.

Its parts: `values` (how a parameter's value is written, and read back), `base` (`Tagged`, what
the formats share), and the formats by the shape of their tags: `xml` (Qwen3-Coder, GLM,
MiniCPM5), `invoke` (MiniMax-M2, Muse Spark) and `xtml` (Kimi K3). The formats' table:
docs/tools.md, "Formats".
"""

from __future__ import annotations

from exod.runner.formats.base import ToolFormat
from exod.runner.formats.tagged.base import Tagged
from exod.runner.formats.tagged.invoke import MUSE_FORMAT, Invoke, Muse
from exod.runner.formats.tagged.xml import Glm, MiniCpm5, Qwen3Coder
from exod.runner.formats.tagged.xtml import KimiK3

__all__ = ["KINDS", "MUSE_FORMAT", "Glm", "Invoke", "KimiK3", "MiniCpm5", "Muse", "Qwen3Coder",
           "Tagged"]

# mlx-lm's parser module -> the class that forces calls in that format.
KINDS: dict[str, type[ToolFormat]] = {"qwen3_coder": Qwen3Coder, "glm47": Glm, "laguna": Glm,
                                      "longcat": Glm, "minimax_m2": Invoke,
                                      "minicpm5": MiniCpm5, "kimi_k3": KimiK3,
                                      "muse_spark": Muse}
