"""A thinking model for tests: a copy of a tiny model (tests.models.tiny) whose tokenizer knows
`<think>` and `</think>` (each one token, as Qwen3's: mlx-lm's tokenizer wrapper then finds them)
and whose chat template opens a think block for the answer, as thinking models' templates do;
`enable_thinking: false` gets an empty block instead. With `tools`, the template is the tiny
tool template (tests.models.tiny.TOOL_CHAT_TEMPLATE: json_tools calls) opening the same block.
Its weights are the tiny model's, random: it thinks only as long as it writes no `</think>`,
which a test can make it write with `logit_bias`.

The two marker tokens take the ids of the tokenizer's last two merges (the rarest pieces), so
the vocabulary keeps its size and every id still has a row in the embedding.

CLI: ``python -m tests.models.thinking TINY_DIR OUT_DIR`` prints OUT_DIR as the last line of
stdout. Plain file work: no mlx.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.models.added_tokens import copy_with_tokens
from tests.models.tiny import TOOL_CHAT_TEMPLATE

THINK = ("<think>", "</think>")
# ChatML, as the tiny model's, with a think block opened for the answer.
OPEN_BLOCK = (
    "{% if enable_thinking is defined and not enable_thinking %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% else %}{{ '<think>\\n' }}{% endif %}")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}" + OPEN_BLOCK +
    "{% endif %}"
)
_PROMPT = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
assert TOOL_CHAT_TEMPLATE.endswith(_PROMPT)
TOOL_THINKING_TEMPLATE = (TOOL_CHAT_TEMPLATE[: -len(_PROMPT)] +
                          "{% if add_generation_prompt %}<|im_start|>assistant\n" + OPEN_BLOCK +
                          "{% endif %}")


def make_thinking_model(tiny: Path, out: Path, tools: bool = False) -> Path:
    """Copy `tiny` to `out` (replaced if there) as the thinking model; returns `out`."""

    def template(folder: Path) -> None:
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["chat_template"] = TOOL_THINKING_TEMPLATE if tools else CHAT_TEMPLATE
        config_path.write_text(json.dumps(config, indent=2))

    copy_with_tokens(tiny, out, THINK, edit=template)
    return Path(out)


if __name__ == "__main__":
    print(make_thinking_model(Path(sys.argv[1]), Path(sys.argv[2])))
