"""The format models (tests.models.formats) as mlx-lm sees them, one case per family: it imports
mlx, so test_format_models.py runs it in a pytest process of its own (tests/own_process.py),
the models named by EXOD_TEST_FORMAT_MODELS (JSON: family -> [steered folder, random folder]).

- mlx-lm infers the family's tool parser from the tokenizer (harmony: none);
- its tokenizer wrapper renders a tool round trip (a call, its result) through the real
  template, as mlx-lm calls it (its own enable_thinking default included);
- the steered model, greedy and at temperature 1, writes exactly what the template renders for
  the assistant's message in every kind of prompt and mode (tests.models.format_chains), and
  mlx-lm's own parser reads the call it writes as the agent's call;
- the random one loads and generates.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.models.families import FAMILIES, Family
from tests.models.format_chains import AGENTS, output, render, scenarios

MODELS: dict[str, list[str]] = json.loads(os.environ.get("EXOD_TEST_FORMAT_MODELS", "{}"))
NAMES = sorted(FAMILIES)
# Where mlx-lm 0.32.2's parser reads a family's call otherwise than the template wrote it.
MISREADS = {
    # Mistral Small 3.2 writes NAME[CALL_ID]ID[ARGS]{...}; the parser's NAME[ARGS] pattern
    # finds the call id, so it names the call after its id.
    "mistral": "the call id for the name",
}


def _load(folder: str) -> tuple[Any, Any]:
    from mlx_lm import load

    model, tokenizer = load(folder)[:2]
    return model, tokenizer


@pytest.fixture(scope="module", params=NAMES)
def family(request: pytest.FixtureRequest) -> Family:
    return FAMILIES[request.param]


def test_tool_parser_is_inferred(family: Family) -> None:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    for folder in MODELS[family.name]:
        tok = load_tokenizer(Path(folder))
        assert tok._tokenizer.init_kwargs.get("tool_parser_type") == family.tool_parser


def test_wrapper_renders_a_tool_round_trip(family: Family) -> None:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    case = next(s for s in scenarios(family) if s.kind == "after")
    for folder in MODELS[family.name]:
        tok = load_tokenizer(Path(folder))
        text = tok.apply_chat_template(case.messages, tools=case.tools,
                                       add_generation_prompt=True, tokenize=False)
        ids = tok.apply_chat_template(case.messages, tools=case.tools,
                                      add_generation_prompt=True)
        assert "exod-tool-ran" in text and len(ids) > 10
        assert tok.decode(ids) == text


def _generate(model: Any, tok: Any, prompt: list[int], temperature: float,
              max_tokens: int = 160) -> str:
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    return "".join(r.text for r in stream_generate(
        model, tok, prompt, max_tokens=max_tokens, sampler=make_sampler(temperature)))


def test_steered_model_writes_what_the_template_renders(family: Family) -> None:
    """In the template's default mode, every kind of prompt, greedy, and one sampled: the
    builder's own check ran every mode through the network in numpy (tests.models.formats);
    this is mlx-lm's generation agreeing with it."""
    model, tok = _load(MODELS[family.name][0])
    hf = tok._tokenizer
    ends = [hf.convert_ids_to_tokens(i) for i in tok.eos_token_ids]
    sampled: set[str] = set()
    for case in (s for s in scenarios(family) if s.mode == family.modes[0]):
        want = output(hf, family, case)
        # mlx-lm stops on an end token without showing it, and its detokenizer drops a space
        # that starts the text (Muse's " to=self").
        want = next((want[:-len(e)] for e in ends if want.endswith(e)), want)
        prompt = hf.encode(render(hf, case, answered=False), add_special_tokens=False)
        temperatures = [0.0] + ([1.0] if not sampled else [])
        sampled.add(case.kind)
        for temperature in temperatures:
            got = _generate(model, tok, prompt, temperature)
            assert got in (want, want.removeprefix(" ")), (case.kind, case.mode, temperature)


def test_parser_reads_the_steered_call(family: Family) -> None:
    import importlib

    from mlx_lm.tokenizer_utils import load as load_tokenizer

    if family.tool_parser is None:
        return  # harmony: mlx-lm has no parser for it (a skip would read as a failure here)
    parser = importlib.import_module(f"mlx_lm.tool_parsers.{family.tool_parser}")
    tok = load_tokenizer(Path(MODELS[family.name][0]))
    for case in scenarios(family):
        if not case.kind.startswith("call:"):
            continue
        text = output(tok._tokenizer, family, case)
        body = text[text.index(parser.tool_call_start) + len(parser.tool_call_start):]
        end = parser.tool_call_end or family.call_end
        call = parser.parse_tool_call(body[:body.index(end)], case.tools)
        call = call[0] if isinstance(call, list) else call
        tool, arguments = AGENTS[case.kind.split(":", 1)[1]]
        assert call["arguments"] == arguments
        if family.name in MISREADS:
            assert call["name"] != tool["function"]["name"], "mlx-lm now reads it right"
        else:
            assert call["name"] == tool["function"]["name"]


def test_random_model_generates(family: Family) -> None:
    model, tok = _load(MODELS[family.name][1])
    ends = {tok._tokenizer.convert_tokens_to_ids(t) for t in (*family.eos_ids, family.eos)}
    assert tok.eos_token_ids == ends
    prompt = tok.apply_chat_template([{"role": "user", "content": "Say hello."}],
                                     add_generation_prompt=True)
    _generate(model, tok, prompt, 1.0, max_tokens=16)
