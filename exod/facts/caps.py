"""What a model can do for a client, read from its tokenizer files without loading it (the
daemon never imports mlx): whether its chat template writes tool calls in a format the runner
parses, whether its vocabulary has single-token think markers (reasoning comes apart from
the answer), and whether it sees pictures (exod.facts.vision). /v1/models reports them, so
clients size themselves before the first request.

The markers are the facts mlx-lm's tokenizer wrapper infers a tool parser from (mlx_lm
0.32's `_infer_tool_parser`) and its think markers, and harmony's tokens (gpt-oss, which
mlx-lm does not parse): the runner finds a model's format the same way (exod.runner.formats).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exod.facts.vision import sees

# Any of these in a chat template: the model writes tool calls mlx-lm parses.
TOOL_MARKERS = ("<minimax:tool_call>", "<|tool_call>", "<start_function_call>",
                "<longcat_tool_call>", "<arg_key>", "<|tool_list_start|>", "<|tool_call_start|>",
                "<|tool_calls_section_begin|>", '<function name="', "[TOOL_CALLS]",
                "<atem:function_calls>", "<tool_call>\n<function=", "<tool_call>\\n<function=")
THINK_PAIRS = (("<think>", "</think>"), ("<longcat_think>", "</longcat_think>"),
               ("<|think:start|>", "<|think:end|>"))
# Think markers of several tokens, by the tokens that make them (mlx-lm's multi-token modes:
# Gemma 4's `<|channel>thought` ... `<channel|>`, Kimi K3's XTML `<|open|>think<|sep|>`).
THINK_TOKENS = (("<|channel>", "<channel|>"),
                ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"))
# harmony's tokens (gpt-oss): reasoning in the analysis channel, calls to `functions.NAME`
# (the runner's exod.runner.formats.harmony reads them; mlx-lm has no parser for it).
HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>")
# Fill-in-the-middle tokens (prefix, suffix, middle), each one token, in the order a prompt
# takes them: Qwen2.5-Coder's, StarCoder's and DeepSeek-Coder's (begin, hole, end).
FIM_TOKENS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
              ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
              ("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>",
               "<\uff5cfim\u2581end\uff5c>"))


@dataclass(frozen=True)
class Capabilities:
    tools: bool | None = None  # None: the files do not tell (not downloaded yet, unreadable)
    thinking: bool | None = None
    vision: bool | None = None  # it takes pictures (served by the vision runner)
    fim: tuple[str, str, str] | None = None  # its fill-in-the-middle tokens, if it has them


def writes_tool_calls(template: str, vocab: set[str]) -> bool:
    if any(marker in template for marker in TOOL_MARKERS) or harmony(vocab):
        return True
    if "<tool_call>" in template and "tool_call.name" in template:  # json_tools
        return True
    return "<|tool_call_start|>" in vocab and "<|tool_call_end|>" in vocab


def thinks(vocab: set[str]) -> bool:
    return (any(start in vocab and end in vocab for start, end in THINK_PAIRS)
            or any(all(t in vocab for t in tokens) for tokens in THINK_TOKENS) or harmony(vocab))


def harmony(vocab: set[str]) -> bool:
    return all(t in vocab for t in HARMONY_TOKENS)


def model_capabilities(model_dir: Path) -> Capabilities:
    """From tokenizer_config.json, chat_template.jinja (or .json) and tokenizer.json."""
    config = _json(model_dir / "tokenizer_config.json")
    tokenizer = _json(model_dir / "tokenizer.json")
    if config is None and tokenizer is None:
        return Capabilities()
    vocab = _vocab(config or {}, tokenizer or {})
    template = _template(model_dir, config or {})
    return Capabilities(tools=template is not None and writes_tool_calls(template, vocab),
                        thinking=thinks(vocab), vision=sees(model_dir) is not None,
                        fim=next((t for t in FIM_TOKENS if all(x in vocab for x in t)), None))


def chat_template(model_dir: Path) -> str | None:
    """The model's chat template (every variant joined), as its files hold it."""
    return _template(model_dir, _json(model_dir / "tokenizer_config.json") or {})


def _json(path: Path) -> dict[str, Any] | None:
    """A file's JSON object; None for what is no such thing (absent, unreadable, no UTF-8, nested
    past the parser's depth, another shape): the files of any model a config names are read
    here, loaded or not, and an odd one must cost /v1/models nothing but that answer."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _template(model_dir: Path, config: dict[str, Any]) -> str | None:
    """The chat template, every variant of it joined (a `tool_use` one writes the calls)."""
    try:
        return (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
    except (OSError, ValueError):
        pass
    raw = (_json(model_dir / "chat_template.json") or {}).get("chat_template")
    raw = raw if isinstance(raw, (str, list)) and raw else config.get("chat_template")
    if isinstance(raw, list):
        raw = "\n".join(t.get("template", "") for t in raw if isinstance(t, dict)
                        and isinstance(t.get("template"), str))
    return raw if isinstance(raw, str) and raw else None


def _vocab(config: dict[str, Any], tokenizer: dict[str, Any]) -> set[str]:
    """The tokens that are one token each: added ones, and the model's own vocabulary."""
    decoder, added = config.get("added_tokens_decoder"), tokenizer.get("added_tokens")
    out = {t.get("content") for t in (decoder.values() if isinstance(decoder, dict) else ())
           if isinstance(t, dict)}
    out |= {t.get("content") for t in (added if isinstance(added, list) else ())
            if isinstance(t, dict)}
    model = tokenizer.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        out |= set(vocab)
    return {t for t in out if isinstance(t, str)}
