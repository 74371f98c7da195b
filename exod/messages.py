"""Every message between the daemon and a runner, defined once, for both ends.

One channel per runner: the socketpair it inherits (`--channel-fd`, the only thing on its
command line), carrying `exod.protocol` frames. Each frame holds one JSON object whose `type`
names a dataclass below; its other keys are that dataclass's fields, checked by
`exod.protocol.from_wire` (types, required, no unknown keys) before either end acts on them. A
runner's first message is `Hello`, whose `version` must equal `VERSION`; the daemon's first is
the runner's start-up spec (`exod.specs.RunnerSpec`), sent once the version matched.

Runner → daemon, lifecycle: Hello, Status, Progress, Ready, Failed, Heartbeat, Stopping;
and Serving, the engine's figures, whenever the number of generations in flight changes.
Runner → daemon, work (one stream per request id, in order, ending with Done or Error):
Prefill (while the prompt goes through the model, before the first Text), Text, ToolCall,
Done, Error; for an Embed, Vectors then Done.
Daemon → runner: Generate (an embedding or reranker model: Embed), Cancel, Shutdown, ClearCache.
Fetcher (`python -m exod.hub`, on the same kind of channel, started by `exod.specs.FetchSpec`)
→ daemon: Hello, Status, Download, Failed, Fetched, Stopping. Daemon → fetcher: Shutdown.
Each end checks what it reads against its own union: a fetcher's message from a runner (or a
runner's from a fetcher) is a protocol error.

Imports nothing heavy: the daemon and the runner both use it. A field added to a message is a
new `VERSION`: the daemon refuses a runner speaking another one (a stale install after an
upgrade) with a clear error, instead of misreading it.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from exod.core import images
from exod.core.request_rules import embeddings as embed_rules
from exod.core.sizes import format_size
from exod.protocol import ProtocolError
from exod.protocol import from_wire as from_wire, to_wire as to_wire  # for the messages' users

VERSION = 19  # 2: Serving; 3: Prefill; 4: Error.param; 5: Held;
# 6: Done.stop_sequence, Generate.count_only; 7: Download, Fetched (the fetcher's messages);
# 8: Generate's tools fields, ToolCall; 9: the rest of the sampling set, logprobs,
# reasoning, chat_template_kwargs, cached_tokens; 10: Generate.strict_tools;
# 11: Serving's speculative decoding counts; 12: Done.reasoning_tokens;
# 13: Generate.think_budget; 14: Generate.names and context_edits, Done.applied_edits;
# 15: Generate.images and content parts (exod.core.images); 16: start-up specs (exod.specs)
# on the channel, not argv; 17: Generate.context_window; 18: Embed, Vectors, Serving's batch
# counts; 19: Shutdown.grace, ClearCache, Serving's disk tier


class Phase(str, enum.Enum):
    """What a runner is doing, for status and for the daemon's decisions (never a parsed text)."""

    STARTING = "starting"  # the process is up, importing mlx
    CONNECTING = "connecting"  # joining its group (a peer host may be down for hours)
    WAITING = "waiting"  # loaded; waiting for the other ranks of its group to load
    LOADING = "loading"
    READY = "ready"
    SERVING = "serving"  # at least one generation in flight
    STOPPING = "stopping"
    FAILED = "failed"


# ---- runner → daemon: lifecycle --------------------------------------------------------------
@dataclass(frozen=True)
class Hello:
    type: ClassVar[str] = "hello"
    version: int
    pid: int


@dataclass(frozen=True)
class Status:
    """`text` is for people (`exoctl status`); decisions use `phase` and the numbers."""

    type: ClassVar[str] = "status"
    phase: Phase
    text: str = ""
    attempt: int = 0  # CONNECTING: which attempt at forming the group
    active: int = 0  # SERVING: generations in flight


@dataclass(frozen=True)
class Progress:
    """Layer `loaded` of `total` is in memory (0 of N: loading has begun)."""

    type: ClassVar[str] = "progress"
    loaded: int
    total: int

    def __post_init__(self) -> None:
        if not 0 <= self.loaded <= self.total:
            raise ProtocolError(f"progress: {self.loaded} of {self.total} layers is impossible")


@dataclass(frozen=True)
class Ready:
    """Loaded (and, for a group, past the group-wide barrier): requests may come."""

    type: ClassVar[str] = "ready"
    vocab_size: int = 0  # 0: unknown
    context_length: int = 0

    def __post_init__(self) -> None:
        # The API's limits come from these: a negative one would let every request through.
        if self.vocab_size < 0 or self.context_length < 0:
            raise ProtocolError("ready: a negative vocab_size or context_length")


@dataclass(frozen=True)
class Failed:
    """Why the runner is about to exit with `exit_code` (the reason status shows)."""

    type: ClassVar[str] = "failed"
    reason: str
    exit_code: int


@dataclass(frozen=True)
class Heartbeat:
    """Sent from the runner's main loop while it serves: a stuck loop stops sending."""

    type: ClassVar[str] = "heartbeat"


HEARTBEAT_EVERY = 5.0  # seconds between a serving runner's heartbeats (status shows their age)


@dataclass(frozen=True)
class Stopping:
    type: ClassVar[str] = "stopping"
    reason: str = ""


@dataclass(frozen=True)
class Serving:
    """How rank 0 serves: `batching` is "continuous" (exod.runner.serving.batch_engine, on every
    rank of a group), else the reason it runs one request at a time. The cache figures count since
    the runner started: `cache_*` and `cached_tokens` are the RAM tier's, `disk_*` the disk
    tier's (exod.runner.prompt_cache); a lookup is served by one tier at most."""

    type: ClassVar[str] = "serving"
    batching: str
    width: int  # max_concurrency
    active: int
    prefill_step: int = 0  # prompt tokens per step at most, over all prompts
    cache_max_bytes: int = 0  # prompt_cache_bytes; 0: no prompt cache
    cache_entries: int = 0
    cache_bytes: int = 0
    cache_lookups: int = 0
    cache_hits: int = 0  # lookups that found a stored prefix
    cached_tokens: int = 0  # prompt tokens taken from the cache instead of prefilled
    prompt_tokens: int = 0  # prompt tokens of every lookup
    draft_tokens: int = 0  # speculative decoding: tokens drafted a step (0: no draft model)
    drafted: int = 0  # draft tokens the model checked
    draft_accepted: int = 0  # of those, the ones the model agreed with
    # An embedding or reranker model (exod.runner.embed): forward passes, and the inputs they
    # held (their mean: the batch size), over all requests.
    batches: int = 0
    batched_inputs: int = 0
    disk_max_bytes: int = 0  # prompt_cache_disk_bytes; 0: no disk tier
    disk_entries: int = 0
    disk_bytes: int = 0
    disk_hits: int = 0  # lookups served from disk (loaded instead of prefilled)
    disk_cached_tokens: int = 0
    disk_load_ms: int = 0  # spent loading the entries that hit
    disk_writes: int = 0
    disk_errors: int = 0  # faults met (each a miss, or a write not made), each logged once
    disk_state: str = ""  # ready, or what it waits for, or why it is off

    def __post_init__(self) -> None:
        # Every status snapshot carries these: a runaway text or an impossible count is a
        # broken runner, not something to show.
        if len(self.batching) > 500 or len(self.disk_state) > 500:
            raise ProtocolError("serving: batching or disk_state is longer than 500 characters")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int) and value < 0:
                raise ProtocolError(f"serving: {f.name} is negative")


# ---- fetcher → daemon (`python -m exod.hub`, on the same kind of channel) -------------------
@dataclass(frozen=True)
class Download:
    """`done` of `total` bytes of a model's files are on disk (`verifying`: hashed)."""

    type: ClassVar[str] = "download"
    done: int
    total: int
    verifying: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.done <= self.total:
            raise ProtocolError(f"download: {self.done} of {self.total} bytes is impossible")


@dataclass(frozen=True)
class Fetched:
    """Every file is in the cache and matches the hub's hashes: the snapshot at `path`."""

    type: ClassVar[str] = "fetched"
    path: str
    commit: str


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
ErrorCode = Literal["bad_request", "stopping", "aborted", "internal", "runner_gone", "hung"]


@dataclass(frozen=True)
class Error:
    type: ClassVar[str] = "error"
    id: str
    code: ErrorCode
    message: str
    param: str | None = None  # the request field at fault, for a `bad_request`


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

    def __post_init__(self) -> None:
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
class ClearCache:
    """`exoctl cache clear`: forget every prompt cache entry, in RAM and on disk."""

    type: ClassVar[str] = "clear_cache"


FromRunner = (Hello | Status | Progress | Ready | Failed | Heartbeat | Stopping | Serving
              | Prefill | Held | Text | ToolCall | Vectors | Done | Error)
ToRunner = Generate | Embed | Cancel | Shutdown | ClearCache
Work = Generate | Embed  # a request, whichever kind of model it is for
FromFetcher = Hello | Status | Download | Failed | Fetched | Stopping
ToFetcher = Shutdown
Event = Prefill | Held | Text | ToolCall | Vectors | Done | Error  # a request's stream
Message = FromRunner | ToRunner | FromFetcher

FROM_RUNNER: dict[str, type[Any]] = {c.type: c for c in typing.get_args(FromRunner)}
TO_RUNNER: dict[str, type[Any]] = {c.type: c for c in typing.get_args(ToRunner)}
FROM_FETCHER: dict[str, type[Any]] = {c.type: c for c in typing.get_args(FromFetcher)}
TO_FETCHER: dict[str, type[Any]] = {Shutdown.type: Shutdown}


def decode_from_runner(obj: dict[str, Any]) -> FromRunner:
    msg: FromRunner = from_wire(obj, FROM_RUNNER)
    return msg


def decode_from_fetcher(obj: dict[str, Any]) -> FromFetcher:
    msg: FromFetcher = from_wire(obj, FROM_FETCHER)
    return msg


def decode_to_runner(obj: dict[str, Any]) -> ToRunner:
    msg: ToRunner = from_wire(obj, TO_RUNNER)
    return msg
