"""What a steered format model writes, found by rendering the family's real template: for each
kind of prompt (a call of an agent's tool, the answer after its result, a plain answer) and each
template mode (thinking on or off), the prompt as the template renders it for generation and
the assistant message the model must write, rendered the same way: the text past the prompt is
the model's output, cut at (or ended by) the family's end token.

An agent's call and the answers are tests.models.agent's (COMMAND, TRIGGER, PLAIN, AFTER), so
tests share them with the agent model; the tools are those agents' own: Claude Code's Bash,
Codex's exec_command, the agent libraries' echo.

Needs transformers (its chat-template renderer: strftime_now, raise_exception); no mlx.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.models.agent import AFTER, COMMAND, PLAIN, TRIGGER
from tests.models.families import Family, Mode

ASK = f"Run `{COMMAND}` in the shell, then tell me what it printed."
ASK_AGAIN = f"Could you run `{COMMAND}` and report its output?"
HELLO = "Say hello."
HELLO_AGAIN = "Hi there, how are you?"
RESULT = f"{TRIGGER}\n"  # what the command prints
RESULT_AGAIN = f"{TRIGGER}\nand more"
# Reasoning, one piece each (no spaces: printable as it is; TRIGGER in none of them).
REASON_CALL = "The-user-wants-a-command-run:-call-the-tool."
REASON_AFTER = "The-tool-has-answered:-report-it."
REASON_PLAIN = "Nothing-to-run:-just-answer."
# Mistral's templates want ids of 9 alphanumerics; every other template takes any.
CALL_ID = "exodcall1"


def _function(name: str, description: str, properties: dict[str, Any],
              required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


_STRING = {"type": "string"}
# Each agent's shell tool (schemas trimmed to what a template shows), and the call the model
# makes: tests.models.agent's CALLS, as arguments.
AGENTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "claude-code": (
        _function("Bash", "Executes a given bash command.",
                  {"command": {**_STRING, "description": "The command to execute"},
                   "description": {**_STRING, "description": "What the command does"}},
                  ["command"]),
        {"command": COMMAND, "description": "Print a line"}),
    "codex": (
        _function("exec_command", "Runs a command in a PTY.",
                  {"cmd": {**_STRING, "description": "Shell command to execute."}}, ["cmd"]),
        {"cmd": COMMAND}),
    "opencode": (
        _function("bash", "Executes a given bash command.",
                  {"command": {**_STRING, "description": "The command to execute"}},
                  ["command"]),
        {"command": COMMAND}),
    "library": (
        _function("echo", "Echo the text back.", {"text": _STRING}, ["text"]),
        {"text": TRIGGER}),
}
# Another tool beside the agent's, whose name starts like Claude Code's shell tool's.
DISTRACTOR = _function("BashOutput", "Reads the output of a background shell.",
                       {"bash_id": _STRING}, ["bash_id"])

KINDS = (*(f"call:{agent}" for agent in AGENTS), "after", "plain")


@dataclass(frozen=True)
class Scenario:
    """One prompt the model answers, and the assistant message it answers with."""

    kind: str  # "call:AGENT", "after" or "plain"
    mode: Mode
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    assistant: dict[str, Any]


def thinks(family: Family, mode: Mode) -> bool:
    """Whether the model reasons in this mode: the template's switch where the mode sets one,
    else the family's default (Gemma 4 and Laguna think only when asked)."""
    if family.reasoning_key is None:
        return False
    for key in ("enable_thinking", "thinking"):
        if key in mode:
            return bool(mode[key])
    return family.name not in ("gemma4", "laguna")


def tool_name(agent: str) -> str:
    return str(AGENTS[agent][0]["function"]["name"])


def _call(agent: str) -> dict[str, Any]:
    tool, arguments = AGENTS[agent]
    return {"id": CALL_ID, "type": "function",
            "function": {"name": tool["function"]["name"], "arguments": dict(arguments)}}


def _assistant(family: Family, reasoning: str | None, **fields: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": "", **fields}
    if reasoning is not None and family.reasoning_key is not None:
        message[family.reasoning_key] = reasoning
    return message


def scenarios(family: Family, *, again: bool = False) -> list[Scenario]:
    """Every kind in every mode of `family`; `again`: the same with other user texts and tool
    results (what stays the same between the two is the template's own)."""
    ask, hello, result = (ASK_AGAIN, HELLO_AGAIN, RESULT_AGAIN) if again else (
        ASK, HELLO, RESULT)
    out = []
    for mode in family.modes:
        think = thinks(family, mode)
        for agent, (tool, _) in AGENTS.items():
            tools = [DISTRACTOR, tool]
            user = {"role": "user", "content": ask}
            out.append(Scenario(
                f"call:{agent}", mode, [user], tools,
                _assistant(family, REASON_CALL if think else None, tool_calls=[_call(agent)])))
            history = [user, _assistant(family, REASON_CALL if think else None,
                                        tool_calls=[_call(agent)]),
                       {"role": "tool", "tool_call_id": CALL_ID, "name": tool_name(agent),
                        "content": result}]
            answer = _assistant(family, REASON_AFTER if think else None, content=AFTER)
            out.append(Scenario("after", mode, history, tools, answer))
            # The next turn of the same conversation: a result is still in it.
            out.append(Scenario("after", mode, [*history, answer,
                                                {"role": "user", "content": hello}],
                                tools, answer))
        plain = _assistant(family, REASON_PLAIN if think else None, content=PLAIN)
        for listed in (None, [DISTRACTOR]):
            first = [{"role": "user", "content": hello}]
            out.append(Scenario("plain", mode, first, listed, plain))
            out.append(Scenario("plain", mode, [*first, plain,
                                                {"role": "user", "content": hello}],
                                listed, plain))
    return out


def render(tokenizer: Any, scenario: Scenario, *, answered: bool) -> str:
    """The scenario's prompt as the template renders it for generation, or (`answered`) with
    the assistant message after it, as the template renders a conversation."""
    messages = scenario.messages + ([scenario.assistant] if answered else [])
    return str(tokenizer.apply_chat_template(
        messages, tools=scenario.tools, add_generation_prompt=not answered, tokenize=False,
        **scenario.mode))


def _common_prefix(a: str, b: str, tokens: tuple[str, ...]) -> int:
    """The length of the longest common prefix of `a` and `b` that cuts no token of `tokens`
    in either."""
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
             min(len(a), len(b)))
    moved = True
    while moved:
        moved = False
        for text in (a, b):
            for token in tokens:
                at = text.find(token, max(0, n - len(token) + 1))
                if 0 <= at < n < at + len(token):
                    n, moved = at, True
    return n


def output(tokenizer: Any, family: Family, scenario: Scenario) -> str:
    """What the model writes for `scenario`: the assistant message's own rendering past the
    generation prompt, up to and with the end token (the family's call or answer end, added
    where the template shows none)."""
    base = render_base(tokenizer, scenario)
    prompt = render(tokenizer, scenario, answered=False)
    if not prompt.startswith(base):
        raise ValueError(f"{family.name} {scenario.kind}: the prompt does not start with the "
                         "conversation")
    own, generation = _own(tokenizer, scenario, base), prompt[len(base):]
    # Where the generation prompt adds what the assistant's rendering has not (Gemma 4's empty
    # thought when not thinking), the model goes on after it.
    text = own[_common_prefix(own, generation, family.tokens):]
    end = family.call_end if scenario.kind.startswith("call:") else family.answer_end
    cut = text.find(end)
    text = text + end if cut < 0 else text[:cut + len(end)]
    reasoning = scenario.assistant.get(family.reasoning_key or "")
    if reasoning and reasoning not in text:
        # The template shows no reasoning here (Gemma 4 beside an answer): the model writes it
        # as the template shows it beside a call.
        text = reasoning_block(tokenizer, family, scenario.mode, reasoning) + text
    return text


def _own(tokenizer: Any, scenario: Scenario, base: str) -> str:
    """The assistant message's own rendering: what follows, in the answered conversation, the
    last message before it. Found from that message's end, since a template may render the
    earlier history otherwise once an answer follows (harmony drops a call's reasoning)."""
    last = scenario.messages[-1]
    anchor = TRIGGER if last["role"] == "tool" else str(last["content"])
    at = base.rfind(anchor)
    if at < 0:
        raise ValueError(f"{scenario.kind}: the last message is not in the conversation")
    tail = base[at:]
    answered = render(tokenizer, scenario, answered=True)
    at = answered.rfind(tail)
    if at < 0:
        raise ValueError(f"{scenario.kind}: the last message ends otherwise once answered")
    return answered[at + len(tail):]


def render_base(tokenizer: Any, scenario: Scenario) -> str:
    """The conversation before the assistant message, with no generation prompt."""
    return str(tokenizer.apply_chat_template(
        scenario.messages, tools=scenario.tools, add_generation_prompt=False, tokenize=False,
        **scenario.mode))


def reasoning_block(tokenizer: Any, family: Family, mode: Mode, reasoning: str) -> str:
    """The family's reasoning syntax around `reasoning`, as its template renders reasoning
    beside a call: the call's output with reasoning, less the same without."""
    agent = "library"
    tool, _ = AGENTS[agent]
    with_it, without = (Scenario(
        f"call:{agent}", mode, [{"role": "user", "content": ASK}], [tool],
        _assistant(family, text, tool_calls=[_call(agent)])) for text in (reasoning, None))
    a, b = output(tokenizer, family, with_it), output(tokenizer, family, without)
    if not a.endswith(b) or reasoning not in a:
        raise ValueError(f"{family.name}: no reasoning syntax found beside a call")
    return a[:len(a) - len(b)]
