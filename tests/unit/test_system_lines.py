"""An instance's `drop_system_lines` (exod.core.system_lines, applied by exod.api.serving): the
lines go from system turns only, with their separators, and Claude Code's request with its
billing line dropped is the request Claude Code sends with CLAUDE_CODE_ATTRIBUTION_HEADER=0."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from exod.api.dialects.anthropic import request as anthropic_request
from exod.api.request import GenRequest
from exod.api.seal import Sealer
from exod.api.serving import without_system_lines
from exod.config.errors import ConfigError
from exod.config.load import load_config
from exod.core.system_lines import drop_lines, drop_system_lines
from exod.wire.messages import Generate

BILLING = "x-anthropic-billing-header:"
LINE = "x-anthropic-billing-header: cc_version=2.1.332.e5a; cc_entrypoint=sdk-cli;"
CAPTURE = Path(__file__).resolve().parents[1] / "agents" / "captures" / "claude-code.json"


@pytest.mark.parametrize("text,left", [
    (f"{LINE}\n\nYou are an agent.", "You are an agent."),  # first: the blank line after it
    (f"A.\n\n{LINE}\n\nB.", "A.\n\nB."),  # between: one separator stays
    (f"A.\n\n{LINE}", "A."),  # last: the separator before it
    (f"A.\n{LINE}\nB.\n", "A.\nB.\n"),
    (LINE, ""),
    ("A.\n  x-anthropic-billing-header: indented", "A.\n  x-anthropic-billing-header: indented"),
    ("The x-anthropic-billing-header: line, quoted", "The x-anthropic-billing-header: line, "
                                                     "quoted"),
])
def test_a_line_goes_with_its_separator(text: str, left: str) -> None:
    assert drop_lines(text, (BILLING,)) == left


def test_only_system_turns_lose_lines_and_an_emptied_turn_goes() -> None:
    turns = [{"role": "system", "content": LINE},
             {"role": "user", "content": f"{LINE}\nhi"},
             {"role": "system", "content": [{"type": "text", "text": f"{LINE}\n\nEnv."},
                                            {"type": "text", "text": LINE}]}]
    assert drop_system_lines(turns, (BILLING,)) == [
        {"role": "user", "content": f"{LINE}\nhi"},
        {"role": "system", "content": [{"type": "text", "text": "Env."}]}]
    untouched = [{"role": "system", "content": "You are an agent."}]
    assert drop_system_lines(untouched, (BILLING,)) is untouched
    assert drop_system_lines(turns, ()) is turns


def parsed(body: dict[str, object]) -> Generate:
    return anthropic_request.parse(body, Sealer(key=bytes(32)))[0].gen


def test_claude_code_without_its_billing_line_is_what_it_sends_with_the_line_off() -> None:
    """The first request of the captured session, with its billing line as Claude Code writes
    it by default (its first system block): dropped by the instance, or never sent (the block
    left out, as CLAUDE_CODE_ATTRIBUTION_HEADER=0 does), the same chat turns."""
    captured = json.loads(CAPTURE.read_text())["requests"][0]["body"]
    off = copy.deepcopy(captured)
    off["system"] = [b for b in off["system"] if not b["text"].startswith(BILLING)]
    body = copy.deepcopy(off)
    body["system"].insert(0, {"type": "text", "text": LINE})
    req = GenRequest(parsed(body), "m")
    dropped = without_system_lines(req, (BILLING,))
    assert dropped.gen.messages == parsed(off).messages != req.gen.messages
    assert without_system_lines(req, ()) is req


def test_the_key_is_read_and_checked(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    path = tmp_path / "exod.yaml"
    path.write_text(f"instances:\n  a:\n    model: {model}\n"
                    f"    drop_system_lines: ['{BILLING}']\n")
    assert load_config(path).instances["a"].drop_system_lines == (BILLING,)
    path.write_text(f"instances:\n  a:\n    model: {model}\n    drop_system_lines: ['']\n")
    with pytest.raises(ConfigError, match="drop_system_lines"):
        load_config(path)
