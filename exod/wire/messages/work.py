"""What the daemon asks of a runner: a request (Generate, or Embed for an embedding or reranker
model), Cancel, Shutdown (a fetcher's too), ClearCacheWork."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from exod.core import images
from exod.core.request_rules import embeddings as embed_rules
from exod.core.sizes import format_size
from exod.wire.protocol import ProtocolError


# ---- daemon → runner --------------------------------------------------------------------------
ToolChoice = Literal["none", "auto", "required", "function"]


@dataclass(frozen=True)
class Image:
    """An image of a request, as the client sent it: its bytes in base64 (the frame is JSON).
    No media type: the runner tells the format from the bytes, never from a label. Capped in
    size here (exod.core.images); its pixels are checked in the runner."""

    data: str

    def __post_init__(self) -> None:
        if len(self.data) > images.encoded_size_bound(images.MAX_IMAGE_BYTES):
            raise ProtocolError(f"generate.images: an image larger than "
                                f"{format_size(images.MAX_IMAGE_BYTES)}")


@dataclass(frozen=True)
class Generate:
    """One generation (fields checked by exod.core.request_rules in the daemon before they get
    here, and again in the runner)."""

    type: ClassVar[str] = "generate"
    id: str
    kind: Literal["chat", "completion"]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logit_bias: dict[str, float] = field(default_factory=dict)
    # Chat turns as the chat template takes them (an assistant's `tool_calls`, a tool's
    # `tool_call_id` kept); checked by exod.api.tool_request.
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    # Read the prompt (template, tokens, checks) and answer Done with its length, generating
    # nothing: Anthropic's count_tokens.
    count_only: bool = False
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's `tools`, checked
    # The tools marked `strict: true`: a call's arguments must validate against its parameters.
    strict_tools: list[str] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    tool_name: str | None = None  # tool_choice "function": the one tool to call
    parallel_tool_calls: bool = True
    # None, {"type": "json_object"} or {"type": "json_schema", "schema": {...}, "strict": b}
    response_format: dict[str, Any] | None = None

    # The rest of the sampling set (exod.runner.serving.sampling); defaults leave each off.
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_context_size: int = 20  # tokens each penalty looks back on (mlx-lm's default)
    presence_penalty: float = 0.0
    presence_context_size: int = 20
    frequency_penalty: float = 0.0
    frequency_context_size: int = 20
    logprobs: bool = False
    top_logprobs: int = 0  # with `logprobs`: how many of the most probable tokens to add
    # Extra variables for the chat template (e.g. enable_thinking), checked by the daemon.
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # Tokens of reasoning at most (Anthropic's thinking.budget_tokens): past them the runner
    # writes the think block's end marker (exod.runner.serving.think_budget). None: unbounded.
    think_budget: int | None = None
    # The fields' names as the client spelled them, where its dialect's differ from these
    # fields' (`messages` is Responses' `input`, `tools[2].function.parameters` Anthropic's
    # `tools[3].input_schema`): the runner's errors name what the client sent.
    names: dict[str, str] = field(default_factory=dict)
    # Edits of the conversation before it reaches the template, applied by the runner, which
    # counts tokens (exod.core.context_edits: Anthropic's context_management).
    context_edits: list[dict[str, Any]] = field(default_factory=list)
    # The pictures the messages show, each placed once by an image part of a content
    # (exod.core.images): only a chat's, and only for a model that sees.
    images: list[Image] = field(default_factory=list)
    # This request's own context window, within the model's (Ollama's `options.num_ctx`): a
    # prompt that fills it is refused, a generation that would pass it ends there. None: the
    # model's.
    context_window: int | None = None
    # Who asked (exod.core.keys: the key's name, "" for none) and its share of the batch: the
    # runner's engine shares the batch between keys by weight, and `batch` work only fills what
    # `interactive` work leaves (exod.runner.serving.fair_share).
    key: str = ""
    weight: float = 1.0
    priority: Literal["interactive", "batch"] = "interactive"

    def __post_init__(self) -> None:
        if not 0 < self.weight < float("inf"):
            raise ProtocolError("generate.weight: a positive number")
        # What the runner reads of every turn without looking further; the rest (tool calls)
        # goes to the chat template as the API checked it. A content is text, or with images
        # a list of text and image parts.
        for msg in self.messages or []:
            content = msg.get("content")
            if not (isinstance(msg.get("role"), str)
                    and (isinstance(content, str) or (self.images and isinstance(content, list)))):
                raise ProtocolError("generate.messages: a message without a text role and "
                                    "content")
        if self.images:
            if len(self.images) > images.MAX_IMAGES:
                raise ProtocolError(f"generate.images: more than {images.MAX_IMAGES} images")
            total = images.encoded_size_bound(images.MAX_REQUEST_IMAGE_BYTES)
            if sum(len(i.data) for i in self.images) > total:
                raise ProtocolError(f"generate.images: more than "
                                    f"{format_size(images.MAX_REQUEST_IMAGE_BYTES)} of images")
            why = images.content_problem(self.messages or [], len(self.images))
            if why is not None:
                raise ProtocolError(f"generate.{why}")
        if (self.tool_choice == "function") != (self.tool_name is not None):
            raise ProtocolError("generate.tool_name: set exactly when tool_choice is function")

    def named(self, param: str) -> str:
        """A field as the client named it (see `names`)."""
        return self.names.get(param, param)


@dataclass(frozen=True)
class Embed:
    """An embeddings request (its inputs into vectors) or a rerank request (the `query` scored
    against each document), for an embedding or reranker model (exod.runner.embed); fields
    checked by exod.core.request_rules.embeddings in the daemon, and again in the runner.
    Answered by Vectors, then Done (its prompt_tokens: the tokens read)."""

    type: ClassVar[str] = "embed"
    id: str
    kind: Literal["embed", "rerank"]
    texts: list[str] = field(default_factory=list)  # the inputs (a rerank: its documents)
    tokens: list[list[int]] = field(default_factory=list)  # or the inputs as token ids
    query: str | None = None  # a rerank's
    truncate: bool = embed_rules.DEFAULT_TRUNCATE  # cut an input past the model's length
    dimensions: int | None = None  # cut each vector to this size (a model trained for it)
    # The fields' names as the client spelled them (`texts` is `input`, or `documents`), for
    # the runner's errors (`input[3]`).
    names: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.texts) + len(self.tokens)
        if not 0 < n <= embed_rules.MAX_INPUTS or (self.texts and self.tokens):
            raise ProtocolError(f"embed: {n} inputs, or texts and tokens together")
        if (self.kind == "rerank") != (self.query is not None) or (
                self.kind == "rerank" and (self.tokens or self.dimensions is not None)):
            raise ProtocolError("embed: a rerank has a query and texts, nothing else")

    @property
    def count(self) -> int:
        return len(self.texts) + len(self.tokens)

    def named(self, param: str) -> str:
        return self.names.get(param, param)


@dataclass(frozen=True)
class Cancel:
    """The client went away: stop that generation now."""

    type: ClassVar[str] = "cancel"
    id: str


@dataclass(frozen=True)
class Shutdown:
    """Rung 1 of the ladder: finish in-flight work within `drain` seconds, then exit 0 within
    `grace` seconds of this message (0: not said), keeping what it can of its prompt cache."""

    type: ClassVar[str] = "shutdown"
    drain: float = 0.0
    grace: float = 0.0


@dataclass(frozen=True)
class ClearCacheWork:
    """`exoctl cache clear`: forget every prompt cache entry, in RAM and on disk."""

    type: ClassVar[str] = "clear_cache"
