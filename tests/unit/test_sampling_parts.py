"""The pure parts of the sampling set and what comes back: the
output of a generation token by token (reasoning apart, logprobs alongside their text, a stop
sequence cutting both), and the response objects' logprobs, reasoning and cached tokens. No
processes, no mlx."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from exod.wire import messages as m
from exod.api.dialects.openai.objects import ChatObjects
from exod.api.reply import Finished, Reply
from exod.api.dialects.openai.request import parse_chat, parse_completion
from exod.api.request import with_template_defaults
from exod.config import ConfigError, load_config
from exod.runner.serving.output import Output, opens_thinking

if TYPE_CHECKING:
    from tests.unit.conftest import ConfigDir

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


# ---- fields (which fields each endpoint takes: test_fields) --------------------------------
def test_new_fields_reach_the_runner_message() -> None:
    g = parse_chat({**CHAT, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2,
                    "repetition_context_size": 64, "presence_penalty": 0.5,
                    "frequency_penalty": -0.5, "logprobs": True, "top_logprobs": 3,
                    "chat_template_kwargs": {"enable_thinking": False}}).gen
    assert (g.top_k, g.min_p, g.repetition_penalty, g.repetition_context_size,
            g.presence_penalty, g.frequency_penalty, g.logprobs, g.top_logprobs,
            g.chat_template_kwargs) == (5, 0.1, 1.2, 64, 0.5, -0.5, True, 3,
                                        {"enable_thinking": False})
    assert m.decode_to_runner(m.to_wire(g)) == g
    c = parse_completion({"model": "m", "prompt": "x", "logprobs": 2}).gen
    assert c.logprobs and c.top_logprobs == 2
    assert not parse_completion({"model": "m", "prompt": "x"}).gen.logprobs


def test_instance_template_defaults_sit_under_the_request_s_own() -> None:
    req = parse_chat({**CHAT, "chat_template_kwargs": {"a": 1}})
    merged = with_template_defaults(req, {"a": 0, "b": 2}).gen.chat_template_kwargs
    assert merged == {"a": 1, "b": 2}
    plain = parse_completion({"model": "m", "prompt": "x"})
    assert with_template_defaults(plain, {"a": 0}) is plain


# ---- a generation's output --------------------------------------------------------------------
class Detok:
    """A streaming detokenizer double: token t is the text TEXT[t], released at once."""

    TEXT = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "!", 8: "<think>", 9: "</think>",
            10: "hmm", 0: "<eos>"}

    def __init__(self) -> None:
        self.text, self.offset = "", 0

    def add_token(self, t: int) -> None:
        self.text += self.TEXT[t]

    def finalize(self) -> None:
        pass

    @property
    def last_segment(self) -> str:
        seg, self.offset = self.text[self.offset:], len(self.text)
        return seg


def entry(t: int) -> m.TokenLogprob:
    return m.TokenLogprob(Detok.TEXT[t], -float(t), list(Detok.TEXT[t].encode()))


def run(tokens: list[int], stops: list[str] = (), thinking: bool = False  # type: ignore[assignment]
        ) -> tuple[str, str, list[str], bool]:
    out = Output(Detok(), list(stops), (8, 9), thinking)
    text, reasoning, logprobs = "", "", []
    for i, t in enumerate(tokens):
        piece = out.add(t, entry(t), eos=t == 0, last=i == len(tokens) - 1)
        text, reasoning = text + piece.text, reasoning + piece.reasoning
        logprobs += [e.token for e in piece.logprobs]
        if out.stopped:
            break
    return text, reasoning, logprobs, out.stopped


def test_output_text_and_logprobs_go_together() -> None:
    assert run([1, 2, 3, 4, 5]) == ("Hello world!", "", ["Hel", "lo", " wor", "ld", "!"], False)
    assert run([1, 2, 0]) == ("Hello", "", ["Hel", "lo"], False)  # the end token is not shown


def test_a_stop_sequence_cuts_the_text_and_drops_its_tokens() -> None:
    text, _, logprobs, stopped = run([1, 2, 3, 4, 5], stops=["world"])
    assert (text, stopped) == ("Hello ", True)
    assert logprobs == ["Hel", "lo", " wor"]  # " wor" starts in the text shown


def test_reasoning_between_markers_and_from_a_template_opened_block() -> None:
    assert run([8, 10, 9, 1, 2]) == ("Hello", "hmm", ["Hel", "lo"], False)
    assert run([10, 9, 1], thinking=True) == ("Hel", "hmm", ["Hel"], False)
    # Stop sequences apply to the answer only.
    assert run([8, 10, 9, 1], stops=["hmm"]) == ("Hel", "hmm", ["Hel"], False)


def test_a_prompt_ends_inside_a_think_block() -> None:
    assert opens_thinking([5, 8, 1], (8, 9)) and not opens_thinking([8, 1, 9, 2], (8, 9))
    assert not opens_thinking([1, 2], (8, 9)) and not opens_thinking([8], None)


# ---- response objects ---------------------------------------------------------------------
LOGPROBS = [m.TokenLogprob("Hi", -0.5, [72, 105], [m.TopLogprob("Hi", -0.5, [72, 105]),
                                                   m.TopLogprob("Ho", -1.5, [72, 111])]),
            m.TokenLogprob("!", -0.1, [33], [])]


def test_chat_logprobs_reasoning_and_cached_tokens() -> None:
    whole = ChatObjects("chat", "m", logprobs=True).whole(Reply(
        "Hi!", Finished.of(m.Done("r", "stop", 5, 2, cached_tokens=3)), reasoning="hmm",
        logprobs=tuple(LOGPROBS)))
    choice: dict[str, Any] = whole["choices"][0]
    assert choice["message"]["reasoning_content"] == "hmm"
    assert choice["logprobs"]["content"][0] == {
        "token": "Hi", "logprob": -0.5, "bytes": [72, 105],
        "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]},
                         {"token": "Ho", "logprob": -1.5, "bytes": [72, 111]}]}
    assert whole["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}
    chunk = ChatObjects("chat", "m", logprobs=True).chunk(None, reasoning="hm", logprobs=[])
    assert chunk["choices"][0]["delta"] == {"reasoning_content": "hm"}
    assert chunk["choices"][0]["logprobs"] == {"content": [], "refusal": None}
    plain = ChatObjects("chat", "m").whole(Reply("Hi!", Finished.of(m.Done("r", "stop", 5, 2)),
                                                 logprobs=tuple(LOGPROBS)))
    assert plain["choices"][0]["logprobs"] is None
    assert "reasoning_content" not in plain["choices"][0]["message"]


def test_completion_logprobs_in_the_legacy_shape() -> None:
    reply = ChatObjects("completion", "m", logprobs=True)
    first, second = reply.chunk("Hi", logprobs=LOGPROBS[:1]), reply.chunk("!",
                                                                          logprobs=LOGPROBS[1:])
    assert first["choices"][0]["logprobs"] == {
        "tokens": ["Hi"], "token_logprobs": [-0.5],
        "top_logprobs": [{"Hi": -0.5, "Ho": -1.5}], "text_offset": [0]}
    assert second["choices"][0]["logprobs"]["text_offset"] == [2]  # counted across chunks


# ---- the per-instance default ----------------------------------------------------------------
def test_instance_chat_template_kwargs_in_the_config(cfg_dir: ConfigDir) -> None:
    base = "instances:\n  x:\n    model: m\n    chat_template_kwargs: "
    config = load_config(cfg_dir.write("exod.yaml", base + "{enable_thinking: false, "
                                                            "style: [a, 1, {b: null}]}\n"))
    assert config.instances["x"].chat_template_kwargs == {"enable_thinking": False,
                                                          "style": ["a", 1, {"b": None}]}
    for bad, fragment in (("{tools: []}", "is not a template variable"),
                          ("{when: 2020-01-01}", "expected plain data (JSON)"),
                          ("[enable_thinking]", "expected a mapping")):
        with pytest.raises(ConfigError) as e:
            load_config(cfg_dir.write("exod.yaml", base + bad + "\n"))
        (problem,) = e.value.problems
        assert "instances.x.chat_template_kwargs" in str(problem) and fragment in str(problem)
