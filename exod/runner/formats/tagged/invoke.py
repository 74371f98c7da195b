"""The formats whose calls are `<invoke name="NAME">` blocks of `<parameter name="KEY">` tags:
MiniMax-M2's, all the calls of a turn in one block, and Muse Spark's, each call a message of its
own addressed to the tool (its tags under the `atem:` namespace).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

from exod.runner.formats.base import Allowed, Literal, Transitions
from exod.runner.formats.grammar_parts import Param, repeat
from exod.runner.formats.tagged.base import Found, Tagged

@dataclass(frozen=True)
class Invoke(Tagged):
    """MiniMax-M2's: `<minimax:tool_call>\\n`, each call `<invoke name="NAME">\\n`, its
    parameters `<parameter name="KEY">VALUE</parameter>\\n`, `</invoke>\\n`, then
    `</minimax:tool_call>`: the calls of a turn in one block. Values: strings as they are, the
    rest `tojson`."""

    invoke: ClassVar[str] = "invoke"
    param: ClassVar[str] = "parameter"
    SHUT = "</parameter>"

    def block(self, allowed: Allowed, lit: Literal, top: str) -> str:
        head = lit(self.start + "\n")
        return f"{top}: {head} {repeat('call_body', '', allowed.most)} {lit(self.end)}\n"

    def opening(self, name: str, lit: Literal) -> str:
        return lit(f'<{self.invoke} name="{name}">\n')

    def closing(self, lit: Literal) -> str:
        return lit(f"</{self.invoke}>\n")

    def key(self, p: Param, lit: Literal) -> str:
        return lit(f'<{self.param} name="{p.name}">')

    def after(self, lit: Literal) -> str:
        return lit("\n")

    def cuts(self) -> tuple[str, ...]:
        return (self.shut, f"</{self.invoke}>", self.end)

    def read(self, body: str) -> Found:
        calls, values = _invokes(self.invoke, self.param)
        return [(name, values.findall(inner)) for name, inner in calls.findall(body)]


@lru_cache(maxsize=4)
def _invokes(invoke: str, param: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    return (re.compile(rf'<{invoke} name="([^"]*)">(.*?)</{invoke}>', re.S),
            re.compile(rf'<{param} name="([^"]*)">(.*?)</{param}>', re.S))


# Muse Spark's turn, as mlx-lm's chat template module gives it (mlx_lm.chat_templates.
# muse_spark.RESPONSE_FORMAT), with its calls: each message has a header, `to=` its recipient.
MUSE_FORMAT: dict[str, Any] = {
    "initial_state": "header",
    "transitions": {
        "header": [("to=self<|message|>", "reasoning"), ("to=user<|message|>", "normal"),
                   ("to=commentary<|message|>", "normal"), ("<atem:function_calls>", "tool")],
        "reasoning": [("<|eom|>", "header")],
        "normal": [("<|eom|>", "header"), ("<|eot|>", "normal")],
        "tool": [("</atem:function_calls>", "normal")],
    },
}


@dataclass(frozen=True)
class Muse(Invoke):
    """Muse Spark's (muse-glimmer's template): each call a message of its own, its header
    addressed to the tool, ` to=NAME<|message|>` (the prompt ends with `<|start|>assistant`),
    then `<atem:function_calls>\\n<atem:invoke name="NAME">\\n`, its parameters
    `<atem:parameter name="KEY">VALUE</atem:parameter>\\n`, and `</atem:invoke>\\n
    </atem:function_calls>`; the next call after `<|eom|><|start|>assistant`."""

    invoke = "atem:invoke"
    param = "atem:parameter"
    SHUT = "</atem:parameter>"

    def table(self, tools: bool) -> tuple[str, Transitions]:
        # Calls sit in the turn's structure: without tools they are still cut out (and dropped).
        return MUSE_FORMAT["initial_state"], MUSE_FORMAT["transitions"]

    def block(self, allowed: Allowed, lit: Literal, top: str) -> str:
        return f"{top}: {repeat('call_body', lit('<|eom|><|start|>assistant'), allowed.most)}\n"

    def opening(self, name: str, lit: Literal) -> str:
        return lit(f' to={name}<|message|>{self.start}\n<{self.invoke} name="{name}">\n')

    def closing(self, lit: Literal) -> str:
        return lit(f"</{self.invoke}>\n{self.end}")

    def thinking(self, lit: Literal) -> tuple[str, str] | None:
        """A message to itself, as Lark: its start and its end (up to the next header)."""
        return lit(" to=self<|message|>"), lit("<|eom|><|start|>assistant")

    def answer(self, lit: Literal) -> str | None:
        """What comes before a constrained answer: the header of a message to the user."""
        return lit(" to=user<|message|>")
