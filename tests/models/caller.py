"""A model that calls tools when asked through `logit_bias`, for tests of `tool_choice: auto`: a
copy of a tiny model with a tool template (tests.models.tiny.with_tool_template) whose tokenizer
has two more tokens, each a whole tool call in the template's format (json_tools: the markers
and a JSON body without whitespace). One is a call mlx-lm's parser reads (CALL), the other one
it cannot (BROKEN: its JSON is cut). Nothing forces them: a test biases one of them (`logit_bias`
+100) and the random-weight model writes it, as a trained model writes a call of its own.

The two tokens take the ids of the tokenizer's last two merges (tests.models.added_tokens).
Their text is printable ASCII without spaces: byte-level BPE shows such characters as
themselves, so the streaming detokenizer decodes them as written.

CLI: ``python -m tests.models.caller TOOLS_DIR OUT_DIR`` prints OUT_DIR and the two ids.
Plain file work: no mlx.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.models.added_tokens import copy_with_tokens

CALL = '<tool_call>{"name":"add","arguments":{"a":1,"b":2}}</tool_call>'
BROKEN = '<tool_call>{"name":"add","arguments":{"a":1</tool_call>'


def make_caller_model(tools_model: Path, out: Path) -> tuple[Path, int, int]:
    """Copy `tools_model` to `out` (replaced if there) with the CALL and BROKEN tokens; returns
    `out` and their ids."""
    # Ascending ids: transformers pairs added tokens with ids in the file's order otherwise.
    call, broken = copy_with_tokens(tools_model, out, (CALL, BROKEN), order=sorted)
    return Path(out), call, broken


if __name__ == "__main__":
    print(*make_caller_model(Path(sys.argv[1]), Path(sys.argv[2])))
