"""Kimi K3's XTML: `<|open|>NAME ...<|sep|>` ... `<|close|>NAME<|sep|>` blocks, every argument
with its type named in its tag, so that mlx-lm's parser reads each value exactly as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exod.core.request_rules import RequestError
from exod.runner.formats.base import Allowed, Literal, Transitions
from exod.runner.formats.grammar_parts import Param, json_args, params, quoted
from exod.runner.formats.tagged.base import Tagged
from exod.runner.formats.tagged.values import is_text, resolved

# Markers of Kimi K3's turn that are no text of the answer (as mlx-lm strips them).
XTML_STRUCTURE = ("<|open|>response<|sep|>", "<|close|>response<|sep|>",
                  "<|close|>message<|sep|>")
_JSON_BLOCK = '<|open|>json type="object"<|sep|>'
_XTML_TYPES = {"integer": "number", "number": "number", "boolean": "boolean",
               "object": "object", "array": "array", "null": "null"}


@dataclass(frozen=True)
class KimiK3(Tagged):
    """Kimi K3's XTML: after the answer's `<|close|>response<|sep|>`, `<|open|>tools<|sep|>`,
    each call `<|open|>call tool="NAME" index="N"<|sep|>` (N from 1 in the message), its
    arguments `<|open|>argument key="KEY" type="TYPE"<|sep|>VALUE<|close|>argument<|sep|>`
    (strings as they are, the rest `tojson`), `<|close|>call<|sep|>`, then
    `<|close|>tools<|sep|>`. A tool whose parameters take no single type each (a union, keys
    beyond `properties`) is called with a JSON block, `<|open|>json type="object"<|sep|>ARGS
    <|close|>json<|sep|>`, which the template writes too. mlx-lm's parser reads the types."""

    SHUT = "<|close|>argument<|sep|>"
    bad_key = ""  # escaped as the template escapes an attribute

    def table(self, tools: bool) -> tuple[str, Transitions]:
        structure = [(m, "normal") for m in XTML_STRUCTURE]
        if not tools:
            return "normal", {"normal": structure}
        return "normal", {"normal": [(self.start, "tool"), *structure],
                          "tool": [(self.end, "normal")]}

    def cuts(self) -> tuple[str, ...]:
        return ("<|close|>", "<|open|>")

    def key(self, p: Param, lit: Literal) -> str:
        schema = resolved(p.schema)
        named = "string" if is_text(schema) else _XTML_TYPES[schema["type"]]
        return lit(f'<|open|>argument key="{_attr(p.name)}" type="{named}"<|sep|>')

    def grammar(self, allowed: Allowed, lit: Literal, top: str) -> str:
        """The answer closed (after reasoning, its response opened first), then the calls,
        each with its own index."""
        rules = [f"{top}: ({lit(XTML_STRUCTURE[0])})? {lit(XTML_STRUCTURE[1])} "
                 f"{lit(self.start)} call_0 {lit(self.end)}\n"]
        for k in range(allowed.most):
            more = f" call_{k + 1}?" if k + 1 < allowed.most else ""
            heads = [lit(f'<|open|>call tool="{_attr(f["name"])}" index="{k + 1}"<|sep|>')
                     for f in allowed.functions]
            rules.append(f"call_{k}: ({' | '.join(f'{h} args_{i}' for i, h in enumerate(heads))})"
                         f" {lit('<|close|>call<|sep|>')}{more}\n")
        for i, fn in enumerate(allowed.functions):
            if self.typed(fn):
                more_rules, body = self.arguments(i, fn, allowed, lit)
                rules += [f'args_{i}: {body or quoted("")}\n', *more_rules]
            else:
                rules += [f"args_{i}: {lit(_JSON_BLOCK)} json_{i} {lit('<|close|>json<|sep|>')}\n",
                          f"json_{i}: {json_args(fn, allowed)}\n"]
        return "".join(rules)

    def typed(self, fn: dict[str, Any]) -> bool:
        """Whether every parameter has a type the template can name."""
        try:
            props = list(params(fn))
        except RequestError:  # keys beyond its properties: the JSON block takes them
            return False
        for p in props:
            schema = resolved(p.schema)
            if not (is_text(schema) or (isinstance(schema, dict)
                                        and schema.get("type") in _XTML_TYPES)):
                return False
        return True


def _attr(text: str) -> str:
    """An attribute's value as Kimi K3's template escapes it."""
    return text.replace("&", "&amp;").replace('"', "&quot;")
