"""The one schema of exod's YAML config: typed, frozen dataclasses.

The validator (`exod.config.validate`) walks these classes generically, so a field added here is
validated, defaulted and documented (`exod check --explain-keys`) without touching any other code.
Each field's `metadata["doc"]` is the text shown to operators.

Durations are plain floats in seconds once loaded; the YAML side accepts `500ms`, `10s`, `2m`,
`1h` or a bare number of seconds (see `exod.config.durations`).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from exod.core.serving import (DEFAULT_KV_GROUP_SIZE, DEFAULT_NUM_DRAFT_TOKENS,
                               DEFAULT_PROMPT_CACHE_BYTES, DEFAULT_PROMPT_CACHE_DISK_BYTES,
                               DEFAULT_QUANTIZED_KV_START)
from exod.hub.ref import HubRef
from exod.config.types import (Duration, DurationOrNever, InstanceName, JsonValue, ModelDir, Octal,
                               Size)
from exod.paths import default_control_socket

RestartMode = Literal["no", "on-failure", "always"]
Parallelism = Literal["pipeline", "tensor"]
ReadyPolicy = Literal["daemon", "instances"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
Backend = Literal["ring", "mpi"]
Autostart = Literal[True, False, "on-demand"]
KvBits = Literal[2, 3, 4, 5, 6, 8]  # what mx.quantize takes
KvGroupSize = Literal[32, 64, 128]

DEFAULT_CONFIG_PATH = Path("/etc/exod/exod.yaml")
DEFAULT_API_PORT = 52415  # exo's port: users of exo find exod where they expect it


def doc(text: str, **extra: object) -> dict[str, object]:
    """Field metadata: operator-facing documentation (plus validator hints)."""
    return {"doc": text, **extra}


@dataclass(frozen=True)
class StopPolicy:
    """The termination ladder. Rung 1 asks, rung 2 SIGTERMs, rung 3 SIGKILLs."""

    grace: Duration = field(
        default=10.0,
        metadata=doc("rung 1: after asking the runner to shut down, wait this long", minimum=0),
    )
    drain: Duration = field(
        default=5.0,
        metadata=doc(
            "within rung 1: let in-flight generations finish this long, then abort them",
            minimum=0,
        ),
    )
    attempts: int = field(
        default=3, metadata=doc("rung 2: how many SIGTERMs to send", minimum=0, maximum=100)
    )
    interval: Duration = field(
        default=5.0,
        metadata=doc("rung 2: wait between SIGTERMs (and after the last)", minimum=0.01),
    )
    kill_interval: Duration = field(
        default=1.0,
        metadata=doc("rung 3: SIGKILL is repeated this often until the process is gone",
                     minimum=0.01),
    )


@dataclass(frozen=True)
class BackoffPolicy:
    """Restart delay, and a download's before it is tried again: exponential on the monotonic
    clock, capped, jittered."""

    initial: Duration = field(default=1.0, metadata=doc("first restart delay", minimum=0))
    multiplier: float = field(default=2.0, metadata=doc("growth per failure", minimum=1.0))
    max: Duration = field(default=60.0, metadata=doc("cap on the delay", minimum=0))
    jitter: float = field(
        default=0.2, metadata=doc("random spread, as a fraction of the delay", minimum=0, maximum=1)
    )
    reset_after: Duration = field(
        default=60.0,
        metadata=doc("a run that stayed ready this long (a download: whose bytes flowed this "
                     "long) resets the delay and the failure count",
                     minimum=0),
    )


@dataclass(frozen=True)
class StartLimit:
    """Too many failures in a window put the instance in `failed` until `exoctl start`."""

    burst: int = field(
        default=5, metadata=doc("this many failures within `interval` make the instance failed",
                                minimum=1))
    interval: Duration = field(default=60.0, metadata=doc("the counting window", minimum=0))


@dataclass(frozen=True)
class GrammarLimits:
    """Bounds on the grammars of constrained decoding (response_format json_schema, forced tool
    calls): a schema past them is refused with a 400, in bounded time and memory."""

    max_schema_kib: int = field(
        default=64, metadata=doc("KiB of a request's schemas (response_format's schema, or all "
                                 "tools' parameters) as compact JSON", minimum=1,
                                 maximum=1 << 20))
    max_size: int = field(
        default=200_000, metadata=doc("symbols of a compiled grammar (llguidance's "
                                      "max_grammar_size)", minimum=1000, maximum=10_000_000))
    max_lexer_states: int = field(
        default=50_000, metadata=doc("states of a grammar's lexer, about 1-2 KB of memory each",
                                     minimum=1000, maximum=10_000_000))
    compile_fuel: int = field(
        default=1_000_000, metadata=doc("lexer work to compile a grammar (about 50,000 a "
                                        "millisecond)", minimum=10_000, maximum=1_000_000_000))
    step_fuel: int = field(
        default=200_000, metadata=doc("lexer work to compute one token's mask (about 14,000 a "
                                      "millisecond)", minimum=10_000, maximum=1_000_000_000))


@dataclass(frozen=True)
class Host:
    name: str = field(
        metadata=doc("host name; compared with node.name", pattern=r"^[A-Za-z0-9._-]{1,253}$")
    )
    address: str = field(metadata=doc("address other hosts use to reach this one"))


@dataclass(frozen=True)
class Instance:
    """One model, split into `shards` ranks (runner processes)."""

    name: InstanceName = field(metadata=doc("the instance's name (its key)", internal=True))
    # kw_only: a defaulted field may not precede the required `model` positionally.
    source: str = field(
        default="",
        compare=False,
        kw_only=True,
        metadata=doc("FILE:LINE:COL of the definition", internal=True),
    )
    model: ModelDir = field(
        metadata=doc("local mlx-lm model directory (holds config.json); or a hub repository: "
                     "`hf:ORG/NAME`, `hf:ORG/NAME@REVISION`, or a mapping with `repo:` and "
                     "`revision:` (a branch, tag or commit), fetched into the cache at start"))
    hub: HubRef | None = field(
        default=None, kw_only=True,
        metadata=doc("the hub repository `model` names, if any", internal=True))
    shards: int = field(default=1, metadata=doc("number of ranks", minimum=1, maximum=64))
    parallelism: Parallelism = field(default="pipeline", metadata=doc("how ranks split the model"))
    layers: tuple[int, ...] | None = field(
        default=None,
        metadata=doc("explicit layers per rank (sums to the model's layer count); "
                     "default even split"),
    )
    autostart: Autostart = field(
        default=True,
        metadata=doc("true: start when the daemon starts; false: only by `exoctl start`; "
                     "on-demand: stay stopped until the first API request names it (that request "
                     "waits while it loads)"))
    idle_stop_after: DurationOrNever = field(
        default=float("inf"),
        metadata=doc("an on-demand instance with no request for this long is stopped (through "
                     "the ladder) until the next request; never keeps it", minimum=0))
    hang_after: DurationOrNever = field(
        default=300.0,
        metadata=doc("while requests are in flight, this long without a generated token means "
                     "the instance is hung: its requests get 503 `hung` and it restarts "
                     "(restart policy and start limit apply). Never applies while loading; "
                     "never disables it", minimum=1))
    context_tokens: int = field(
        default=4096,
        metadata=doc("KV cache reserved per concurrent generation in the memory estimate "
                     "(capped at the model's max_position_embeddings)", minimum=1))
    # `inherit` fields take their value from `defaults:`; a partial mapping given here
    # overrides only the keys it names.
    restart: RestartMode = field(
        default="on-failure", metadata=doc("restart policy", inherit="restart")
    )
    stop: StopPolicy = field(
        default_factory=StopPolicy, metadata=doc("termination ladder overrides", inherit="stop")
    )
    backoff: BackoffPolicy = field(
        default_factory=BackoffPolicy, metadata=doc("restart backoff overrides", inherit="backoff")
    )
    start_limit: StartLimit = field(
        default_factory=StartLimit, metadata=doc("start-limit overrides", inherit="start_limit")
    )
    env: Mapping[str, str] = field(
        default_factory=dict, metadata=doc("extra environment variables for the runners")
    )
    dtype: DType = field(default="auto", metadata=doc("cast weights; auto = float32 on CPU"))
    hosts: tuple[Host, ...] = field(
        default=(), metadata=doc("hosts the ranks run on, in rank order; default all on this host")
    )
    port_base: int | None = field(
        default=None,
        metadata=doc("rank r listens on port_base + r, and rank 0 also on port_base + shards "
                     "for the group's control connections (multi-rank only)",
                     minimum=1024, maximum=65535),
    )
    backend: Backend = field(default="ring", metadata=doc("mx.distributed backend"))
    peer_timeout: Duration = field(
        default=60.0,
        metadata=doc("once a multi-rank group is ready, silence from it this long means a peer "
                     "is lost (e.g. a network partition): the ranks restart and regroup. A group "
                     "whose ranks all run on this host must also form within it (30s at least) "
                     "once every rank is joining, else it restarts on new ports. Never applies "
                     "while loading", minimum=0.5))
    max_concurrency: int | None = field(
        default=None, metadata=doc("generations run at once by this instance: the width of its "
                                   "batch (decoded as one batch, on every rank of a sharded "
                                   "instance); default: sized by memory admission at each start, "
                                   "as many as the KV cache of `context_tokens` each fits beside "
                                   "the weights (at most 16, at least 1)",
                                   minimum=1, maximum=256)
    )
    prompt_cache_bytes: int = field(
        default=DEFAULT_PROMPT_CACHE_BYTES,
        metadata=doc("bytes of KV cache kept in RAM from earlier requests, so a request that "
                     "extends one (the next turn of a chat) prefills only what is new; least "
                     "recently used entries go first, to the disk tier; 0 disables it (a group "
                     "counts rank 0's bytes)",
                     minimum=0, maximum=1 << 50))
    prompt_cache_disk_bytes: Size = field(
        default=DEFAULT_PROMPT_CACHE_DISK_BYTES,
        metadata=doc("bytes of KV cache kept on disk (the prompt cache's disk tier, under "
                     "prompt_cache_dir), written behind the requests when entries leave RAM, "
                     "when the instance is idle and at a stop; read back after any restart, so "
                     "the same long prompt is loaded instead of prefilled; least recently used "
                     "entries go first; each rank of a group keeps its own layers' part up to "
                     "this; 0 disables it", minimum=0,
                     inherit="prompt_cache_disk_bytes"))
    prompt_cache_dir: Path | None = field(
        default=None,
        metadata=doc("the folder under which the instance keeps its disk tier, in a folder of "
                     "its own name", inherit="prompt_cache_dir"))
    warm: tuple[Path, ...] = field(
        default=(),
        metadata=doc("prompt files prefilled into the prompt cache at each start unless it holds "
                     "them already (an agent's system prompt and tools): JSON with `messages` "
                     "and optionally `tools`, as a chat request has them, or plain text (one "
                     "system message)"))
    grammar: GrammarLimits = field(
        default_factory=GrammarLimits,
        metadata=doc("bounds of constrained decoding (response_format, forced tool calls)"))
    max_queue: int = field(
        default=16, metadata=doc("requests waiting beyond max_concurrency before 429", minimum=0)
    )
    max_tokens_cap: int | None = field(
        default=None,
        metadata=doc("the most tokens one request may ask for (max_tokens); default and upper "
                     "bound: the model's context window", minimum=1),
    )
    chat_template_kwargs: Mapping[str, JsonValue] = field(
        default_factory=dict,
        metadata=doc("extra variables for the model's chat template, e.g. {enable_thinking: "
                     "false}; a request's own `chat_template_kwargs` override them key by key"))
    # mlx-lm's generation options (exod.config.mlx_options checks what goes with what).
    kv_bits: KvBits | None = field(
        default=None,
        metadata=doc("quantize the KV cache to this many bits (mlx-lm's kv_bits; 4 or 8 are "
                     "usual): less memory per token, counted so by memory admission. mlx-lm "
                     "cannot batch a quantized cache: the instance serves its requests by turns, "
                     "with no prompt cache (status says so); null: float cache"))
    kv_group_size: KvGroupSize = field(
        default=DEFAULT_KV_GROUP_SIZE,
        metadata=doc("with kv_bits: values quantized together (must divide the model's head "
                     "dimension)"))
    quantized_kv_start: int = field(
        default=DEFAULT_QUANTIZED_KV_START,
        metadata=doc("with kv_bits: a generation's cache stays in float until it holds this "
                     "many tokens, then is quantized", minimum=0))
    max_kv_size: int | None = field(
        default=None,
        metadata=doc("a rotating KV cache of this many tokens per generation (mlx-lm's "
                     "max_kv_size): older tokens but the first 4 are overwritten, so a "
                     "generation may run past it in bounded memory; null: the cache grows",
                     # past int32, mlx's batch step fails (std::bad_cast) on every request
                     minimum=8, maximum=1 << 30))
    draft_model: ModelDir | None = field(
        default=None,
        metadata=doc("speculative decoding: a small model of the same vocabulary drafts "
                     "tokens the model checks, giving the same tokens faster (mlx-lm's "
                     "draft_model). A directory or a hub name (`hf:ORG/NAME[@REVISION]`, "
                     "fetched as `model` is). mlx-lm cannot batch it: the instance serves its "
                     "requests by turns, with no prompt cache (status says so)"))
    draft_hub: HubRef | None = field(
        default=None, kw_only=True,
        metadata=doc("the hub repository `draft_model` names, if any", internal=True))
    num_draft_tokens: int = field(
        default=DEFAULT_NUM_DRAFT_TOKENS,
        metadata=doc("with draft_model: tokens drafted per step", minimum=1, maximum=64))
    adapters: Path | None = field(
        default=None,
        metadata=doc("a LoRA adapter directory (adapter_config.json and adapters.safetensors, as "
                     "mlx_lm.lora writes them), applied at load (mlx-lm's adapter_path)"))
    wired_limit: Size | None = field(
        default=None,
        metadata=doc("macOS (Metal) only: bytes of memory mlx keeps wired (mx.set_wired_limit); "
                     "null: the GPU's recommended working set, as mlx_lm.server sets it; 0: "
                     "nothing kept wired (mlx's own default). Refused on other systems, which "
                     "have none"))
    cluster_key_file: Path | None = field(
        default=None,
        metadata=doc("file holding the group's shared secret (at least 16 bytes; the same file "
                     "on every host, readable only by exod): ranks prove they hold it before "
                     "joining. Required when ranks run on several hosts; a single-host group "
                     "gets a fresh secret at each start"),
    )

    @property
    def always_on(self) -> bool:
        return self.autostart is True

    @property
    def on_demand(self) -> bool:
        return self.autostart == "on-demand"


@dataclass(frozen=True)
class Defaults:
    restart: RestartMode = field(default="on-failure", metadata=doc("restart policy for instances"))
    stop: StopPolicy = field(default_factory=StopPolicy, metadata=doc("the termination ladder"))
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy, metadata=doc("restart backoff"))
    start_limit: StartLimit = field(default_factory=StartLimit, metadata=doc("start limit"))
    stall_after: Duration = field(
        default=60.0,
        metadata=doc("status notes 'no progress for …' after this long without a layer; "
                     "nothing is ever killed for it", minimum=0),
    )
    memory_headroom: Size = field(
        default=512 * 2**20,
        metadata=doc("memory admission: a rank starts only if its estimated need fits in what "
                     "the host has available (MemAvailable on Linux) less this much", minimum=0),
    )
    prompt_cache_disk_bytes: Size = field(
        default=DEFAULT_PROMPT_CACHE_DISK_BYTES,
        metadata=doc("each instance's prompt_cache_disk_bytes, unless it sets its own",
                     minimum=0))
    prompt_cache_dir: Path | None = field(
        default=None,
        metadata=doc("where instances keep the prompt cache's disk tier, a folder per instance; "
                     "default: prompt-cache in the service's state directory (StateDirectory=), "
                     "else in its cache directory (a user unit's CacheDirectory=), else "
                     "/var/lib/exod/prompt-cache as root, else ~/.cache/exod/prompt-cache"))


@dataclass(frozen=True)
class Hub:
    """Models named by hub repository (`model: hf:ORG/NAME`)."""

    cache: Path | None = field(
        default=None,
        metadata=doc("huggingface_hub cache folder models are fetched into; default: "
                     "$HF_HUB_CACHE, else the service's state directory (StateDirectory=, "
                     "/var/lib/exod/hub as root), else the user's own cache (~/.cache/"
                     "huggingface/hub), shared with mlx-lm"))
    offline: bool = field(
        default=False,
        metadata=doc("never contact the hub: a cached model starts with no request, a missing "
                     "one fails with the reason (also when exod's environment sets "
                     "HF_HUB_OFFLINE=1)"))
    hf_token_file: Path | None = field(
        default=None,
        metadata=doc("file holding the access token for gated or private repositories (mode "
                     "0600, owned by exod's user); read by the fetcher only, never put in an "
                     "argv, an environment, a log or status"))
    stall_after: Duration = field(
        default=60.0,
        metadata=doc("a download with no new byte for this long is shown as stalled and "
                     "retried with backoff (never given up)", minimum=1))


@dataclass(frozen=True)
class Control:
    socket: Path = field(
        default_factory=default_control_socket,
        metadata=doc("path of exoctl's control socket; runners' notify socket sits beside it "
                     "(default /run/exod/control.sock as root, else $XDG_RUNTIME_DIR/exod/)"),
    )
    mode: Octal = field(default=0o660, metadata=doc("file mode of the control socket"))
    group: str | None = field(
        default=None,
        metadata=doc("a group whose members may use the control socket (besides exod's own "
                     "user and root); default: exod's own group, when `mode` grants the group "
                     "access", pattern=r"^[A-Za-z0-9._-]{1,64}$"),
    )
    max_connections: int = field(
        default=64, metadata=doc("control connections open at once; beyond it the oldest idle "
                                 "one is dropped", minimum=1, maximum=4096))


@dataclass(frozen=True)
class Node:
    name: str = field(
        default_factory=socket.gethostname,
        metadata=doc("this host's name in `hosts:` lists", pattern=r"^[A-Za-z0-9._-]{1,253}$"),
    )


@dataclass(frozen=True)
class Api:
    listen: str = field(
        default=f"127.0.0.1:{DEFAULT_API_PORT}",
        metadata=doc("HOST:PORT of the OpenAI-compatible HTTP API ([::1]:PORT for IPv6, port 0: "
                     "any free one); empty string disables it",
                     pattern=r"^$|^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):[0-9]{1,5}$"),
    )
    token_file: Path | None = field(
        default=None,
        metadata=doc("file holding the bearer tokens required on every endpoint but /health: "
                     "one per line ('#' starts a comment); re-read on reload"),
    )
    insecure_public: bool = field(
        default=False,
        metadata=doc("allow `listen` on a non-loopback address without a token_file (anyone "
                     "who reaches the port can then use the models)"),
    )
    allowed_hosts: tuple[str, ...] = field(
        default=(),
        metadata=doc("extra names accepted in the Host header, besides the listen address, "
                     "localhost and loopback addresses (guards against DNS rebinding); '*' "
                     "accepts any"),
    )
    cors_origins: tuple[str, ...] = field(
        default=(),
        metadata=doc("web origins (e.g. https://app.example) allowed to call the API from a "
                     "browser; default none (CORS off)"),
    )
    max_body_kib: int = field(
        default=4096,
        metadata=doc("largest request body, in KiB; a larger one gets 413 before it is read",
                     minimum=1, maximum=262144),
    )
    max_connections: int = field(
        default=256,
        metadata=doc("HTTP connections open at once; beyond it the oldest idle one is dropped, "
                     "or the new one refused when every connection is busy",
                     minimum=1, maximum=65536),
    )
    header_timeout: Duration = field(
        default=10.0,
        metadata=doc("a connection must send a whole request head within this long (from its "
                     "start, or from its previous answer), else it is closed", minimum=0.1),
    )
    body_timeout: Duration = field(
        default=30.0, metadata=doc("a request body must arrive within this long", minimum=0.1))
    strict_fields: bool = field(
        default=False,
        metadata=doc("refuse (400, naming it) a request field exod does not know; by default "
                     "such a field is accepted and has no effect, and is logged once, counted "
                     "in /metrics and named in the answer's x-exod-ignored-fields header, as "
                     "new client versions keep adding fields"),
    )


@dataclass(frozen=True)
class Config:
    """A whole, validated configuration: the main file plus its includes."""

    path: Path = field(metadata=doc("the main file this config was read from", internal=True))
    node: Node = field(default_factory=Node, metadata=doc("this host"))
    control: Control = field(default_factory=Control, metadata=doc("the control socket"))
    ready: ReadyPolicy = field(
        default="daemon",
        metadata=doc("when to tell the service manager READY=1: daemon up, or every autostart "
                     "instance ready"),
    )
    api: Api = field(default_factory=Api, metadata=doc("the HTTP API"))
    hub: Hub = field(default_factory=Hub, metadata=doc("models named by hub repository"))
    defaults: Defaults = field(default_factory=Defaults, metadata=doc("daemon-wide defaults"))
    include: tuple[str, ...] = field(
        default=(), metadata=doc("glob patterns of drop-in files holding `instances:`")
    )
    instances: Mapping[str, Instance] = field(
        default_factory=dict, metadata=doc("instance name → definition")
    )
