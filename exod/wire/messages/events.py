"""A request's stream, runner → daemon, in order and ending with Done or Error: Prefill
(before the first Text), Held, Text, ToolCall; an Embed's Vectors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from exod.core.request_rules import embeddings as embed_rules
from exod.wire.protocol import ProtocolError


# ---- runner → daemon: work ------------------------------------------------------------------
@dataclass(frozen=True)
class TopLogprob:
    """One of the most probable tokens at a position (a part of `TokenLogprob`)."""

    token: str
    logprob: float
    bytes: list[int]


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability, and the `top` most probable at its position. The
    distribution is the one sampled from after logit_bias and the penalties, before temperature
    and the top-k/top-p/min-p filters (OpenAI's definition). `bytes`: the token's own UTF-8
    bytes (a character may span tokens; `token` then holds U+FFFD for the missing part)."""

    token: str
    logprob: float
    bytes: list[int]
    top: list[TopLogprob] = field(default_factory=list)


@dataclass(frozen=True)
class Text:
    """The next piece of a generation's text, as soon as it is decoded. `reasoning`: text
    inside a think block (the model's tokenizer knows its markers), apart from the answer.
    `logprobs`: one per token of `text`, when the request asked for them."""

    type: ClassVar[str] = "text"
    id: str
    text: str
    reasoning: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass(frozen=True)
class Prefill:
    """A chunk of a request's prompt went through the model: progress before the first token
    (a long prompt on a CPU can take minutes), which hang detection counts as such. 0 of 0:
    the request is still being read (its template and tokens), not admitted yet."""

    type: ClassVar[str] = "prefill"
    id: str
    done: int  # prompt tokens processed so far
    total: int

    def __post_init__(self) -> None:
        if not 0 <= self.done <= self.total:
            raise ProtocolError(f"prefill: {self.done} of {self.total} tokens is impossible")


@dataclass(frozen=True)
class Held:
    """A token was generated but its text is held back (bytes of a character not complete yet,
    or what may be the start of a stop sequence): progress with no text to show, which hang
    detection counts as such, so a run of such tokens is never taken for a hung runner."""

    type: ClassVar[str] = "held"
    id: str
    tokens: int  # completion tokens so far

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ProtocolError(f"held: {self.tokens} tokens is impossible")


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model made, found in its output by the model's own parser
    (exod.runner.serving.tool_calls): `arguments` is a JSON object's text."""

    type: ClassVar[str] = "tool_call"
    id: str
    name: str
    arguments: str
    # The call's id where the model's format gives calls ids of its own shape (Mistral's nine
    # letters and digits, which its template demands back); "": the API makes one.
    call_id: str = ""


FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass(frozen=True)
class Done:
    type: ClassVar[str] = "done"
    id: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    stop_sequence: str | None = None  # the one that ended the text (finish_reason "stop")
    cached_tokens: int = 0  # prompt tokens taken from the prompt cache, not prefilled
    reasoning_tokens: int = 0  # of completion_tokens: those of the think block, markers too
    # The request's context_edits that changed the prompt, as Anthropic reports them
    # ({"type", "cleared_input_tokens", "cleared_thinking_turns" | "cleared_tool_uses"}).
    applied_edits: list[dict[str, Any]] = field(default_factory=list)


# Bytes of results one Vectors event carries at most: in base64, well under the 1 MiB frame a
# runner may send (exod.daemon.channel.MAX_RUNNER_FRAME).
VECTORS_BYTES = 512 * 1024


@dataclass(frozen=True)
class Vectors:
    """Results of an Embed, in order: `count` of them from input `start` (a rerank's from
    document `start`), each an embedding (or a relevance score: one number), as float32
    little-endian bytes in base64. Several frames per request: a runner's frame is small."""

    type: ClassVar[str] = "vectors"
    id: str
    start: int
    count: int
    data: str

    def __post_init__(self) -> None:
        if self.start < 0 or self.count < 1 or self.start + self.count > embed_rules.MAX_INPUTS:
            raise ProtocolError(f"vectors: {self.count} from {self.start} is impossible")


# `hung` is the daemon's own: it ends the requests of a runner that stopped making progress.
# `context_length_exceeded`: a `bad_request` whose prompt leaves no room in the context window
# (its numbers in `prompt_tokens` and `window`), which each dialect words as its clients act on.
ErrorCode = Literal["bad_request", "context_length_exceeded", "stopping", "aborted", "internal",
                    "runner_gone", "hung", "key_revoked"]


@dataclass(frozen=True)
class Error:
    type: ClassVar[str] = "error"
    id: str
    code: ErrorCode
    message: str
    param: str | None = None  # the request field at fault, for a `bad_request`
    prompt_tokens: int | None = None  # context_length_exceeded: the prompt's length,
    window: int | None = None  # the window it did not fit,
    own_window: bool = False  # and whether that window was the request's own (`num_ctx`)
