"""The one schema of exod's YAML config: typed, frozen dataclasses.

The validator (`exod.config.validate`) walks these classes generically, so a field added here is
validated, defaulted and documented (`exod check --explain-keys`) without touching any other code.
Each field's `metadata["doc"]` is the text shown to operators, the one copy of it: `exod check
--explain` prints it, and exod.yaml(5)'s KEYS section is written from it (`make man`). In it,
`code` is set in bold on the man page.

Durations are plain floats in seconds once loaded; the YAML side accepts `500ms`, `10s`, `2m`,
`1h` or a bare number of seconds (see `exod.core.durations`). What a runner reads of an instance
(`RunnerOptions`, which `Instance` inherits) is declared in exod.wire.options, beside the wire
that carries it to the runner.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from exod.core.names import ALIAS_RE
from exod.core.serving import DEFAULT_PROMPT_CACHE_DISK_BYTES
from exod.core.images import MAX_IMAGES, MAX_PIXELS, REQUEST_MEGAPIXELS
from exod.core.restarts import RestartMode
from exod.core.shards import Parallelism
from exod.core.hub_ref import HubRef
from exod.core import keys as core_keys
from exod.core.keys import KeyLimits, Priority, Scope
from exod.core.kinds import (CountOrAuto, Duration, DurationOrNever, InstanceName, JsonValue,
                             ModelDir, Network, Octal, Size, doc)
from exod.paths import default_control_socket
from exod.wire.options import Backend, RunnerOptions

ReadyPolicy = Literal["daemon", "instances"]
PlacementMode = Literal["manual", "auto"]
Autostart = Literal[True, False, "on-demand"]

DEFAULT_CONFIG_PATH = Path("/etc/exod/exod.yaml")
DEFAULT_API_PORT = 52415  # exo's port: users of exo find exod where they expect it


@dataclass(frozen=True)
class StopPolicy:
    """The termination ladder. Rung 1 asks, rung 2 SIGTERMs, rung 3 SIGKILLs."""

    grace: Duration = field(
        default=10.0,
        metadata=doc("Rung 1: after asking the runner to shut down, wait this long. Within it, "
                     "after `drain`, the runner writes the prompt cache entries not on disk yet "
                     "(`prompt_cache_disk_bytes`), up to a half second before its end: what "
                     "does not fit is dropped, never waited for.", minimum=0),
    )
    drain: Duration = field(
        default=5.0,
        metadata=doc("Within rung 1: let the generations in flight go on this long, then end them "
                     "with an error. Never more than `grace` less one second.", minimum=0),
    )
    attempts: int = field(
        default=3,
        metadata=doc("Rung 2: how many SIGTERMs to send.", minimum=0, maximum=100),
    )
    interval: Duration = field(
        default=5.0,
        metadata=doc("Rung 2: the wait between two SIGTERMs, and after the last.", minimum=0.01),
    )
    kill_interval: Duration = field(
        default=1.0,
        metadata=doc("Rung 3: SIGKILL is sent again this often until the process is gone.",
                     minimum=0.01),
    )


@dataclass(frozen=True)
class BackoffPolicy:
    """Restart delay, and a download's before it is tried again: exponential on the monotonic
    clock, capped, jittered."""

    initial: Duration = field(default=1.0, metadata=doc("The first delay.", minimum=0))
    multiplier: float = field(
        default=2.0,
        metadata=doc("The delay grows by this factor with each restart.", minimum=1.0),
    )
    max: Duration = field(default=60.0, metadata=doc("The longest delay.", minimum=0))
    jitter: float = field(
        default=0.2,
        metadata=doc("A random spread of up to this fraction of the delay, either way.",
                     minimum=0, maximum=1),
    )
    reset_after: Duration = field(
        default=60.0,
        metadata=doc("A run that stayed ready this long (a download: whose bytes flowed this "
                     "long) resets the delay and the failure count.", minimum=0),
    )


@dataclass(frozen=True)
class StartLimit:
    """Too many failures in a window put the instance in `failed` until `exoctl start`."""

    burst: int = field(
        default=5,
        metadata=doc("This many failures within `interval` make the instance `failed`, until "
                     "`exoctl start NAME`.", minimum=1),
    )
    interval: Duration = field(
        default=60.0,
        metadata=doc("The window in which failures are counted.", minimum=0),
    )


@dataclass(frozen=True)
class KeepAliveBounds:
    """What a request's own `keep_alive` (Ollama's API) may set an on-demand instance's idle
    window to: the floor keeps one client from stopping a model others use, the ceiling from
    holding its memory for ever."""

    min: Duration = field(
        default=0.0,
        metadata=doc("The shortest window a request may set: the floor that keeps one client "
                     "from stopping a model that others use (`keep_alive: 0` then stops it "
                     "after this long).", minimum=0))
    max: DurationOrNever = field(
        default=float("inf"),
        metadata=doc("The longest window a request may set: the ceiling that keeps one client "
                     "from holding the model's memory (`keep_alive: -1` then keeps it this "
                     "long).", minimum=0))


@dataclass(frozen=True)
class Host:
    name: str = field(
        metadata=doc("The host's name, compared with its `node.name`.",
                     pattern=r"^[A-Za-z0-9._-]{1,253}$"),
    )
    address: str = field(
        metadata=doc("The address (or DNS name) at which the other hosts reach this host's rank."),
    )


@dataclass(frozen=True)
class Instance(RunnerOptions):
    """One model, split into `shards` ranks (runner processes). Its runner options
    (`RunnerOptions`) come first in the class, last in `exod check --explain-keys`."""

    name: InstanceName = field(metadata=doc("the instance's name (its key)", internal=True))
    # kw_only: a defaulted field may not precede the required `model` positionally.
    source: str = field(
        default="",
        compare=False,
        kw_only=True,
        metadata=doc("FILE:LINE:COL of the definition", internal=True),
    )
    model: ModelDir = field(
        metadata=doc("A local mlx-lm model directory, holding `config.json`; exod checks that it "
                     "exists and holds that file. Or a model named by hub repository: "
                     "`hf:ORG/NAME`, `hf:ORG/NAME@REVISION` (a branch, a tag or a 40-digit "
                     "commit; default `main`), or a mapping with `repo:` and `revision:`. The "
                     "`hf:` prefix keeps a name apart from a relative path. Such a model is "
                     "fetched into the cache (`hub.cache`) at the instance's first start, in the "
                     "`downloading` state; see MODELS BY NAME in exod.yaml(5)."),
    )
    hub: HubRef | None = field(
        default=None, kw_only=True,
        metadata=doc("the hub repository `model` names, if any", internal=True))
    # compare=False: a reload that changes only the names restarts nothing (the daemon reads
    # them from its current config).
    aliases: tuple[str, ...] = field(
        default=(), compare=False,
        metadata=doc("More names a request's `model` may give the instance, in every API "
                     "dialect: the names clients already have configured, e.g. "
                     "`[llama3.2, qwen3:8b]` (Ollama's form, `[NAMESPACE/]MODEL[:TAG]`). A name "
                     "without a tag is the same as with `:latest`, for the instance's own name "
                     "too (Raycast appends `:latest`). No two instances may answer to the same "
                     "name; `exod check` names the clash. Aliases are listed by neither "
                     "`/v1/models` nor `/api/tags`, and a reload that changes only them "
                     "restarts nothing.", pattern=ALIAS_RE))
    shards: CountOrAuto = field(
        default=1,
        metadata=doc("The number of ranks, that is runner processes, that share the model. "
                     "`auto` (only with `placement: auto`, where it is the default): one rank on "
                     "each node the planner uses, as few as hold the model.",
                     minimum=1, maximum=64),
    )
    placement: PlacementMode = field(
        default="manual",
        metadata=doc("`manual`: the ranks run where `hosts` says (every rank on this host without "
                     "it), with the layers `layers` gives them. `auto`: the planner chooses the "
                     "nodes and the split, from the real size of each layer (the safetensors "
                     "headers), the KV cache of `context_tokens` × `max_concurrency`, and each "
                     "rank's runtime; leave out `hosts` and `layers` (`port_base` stays yours "
                     "to give). `exod plan` prints the plan, and `exod plan --write` the "
                     "`manual` form of it. Until nodes find each other (a cluster), the only "
                     "node is this host. See Placement in docs/sharding.md."),
    )
    parallelism: Parallelism = field(
        default="pipeline",
        metadata=doc("How the ranks split the model: `pipeline` gives each rank a range of "
                     "layers, and needs a model whose layers form a list; `tensor` gives each "
                     "rank a slice of every layer, and needs attention heads and projections that "
                     "divide by `shards`. `exod check` tries the split on the model family (built "
                     "from config.json with no weights) and refuses a layout that cannot work, "
                     "with the reason."),
    )
    layers: tuple[int, ...] | None = field(
        default=None,
        metadata=doc("With `parallelism: pipeline`, the number of layers of each rank, in rank "
                     "order: one entry per rank, each at least 1, adding up to the model's layer "
                     "count. Null splits the layers evenly, the first ranks taking the remainder. "
                     "Not allowed with `parallelism: tensor`."),
    )
    autostart: Autostart = field(
        default=True,
        metadata=doc("`true` starts the instance when exod starts (and when a reload adds it); "
                     "`false` waits for `exoctl start`; `on-demand` leaves it stopped until the "
                     "first HTTP API request names it: that request starts it and waits in the "
                     "instance's queue while it loads (status shows the load as usual). When "
                     "memory admission would refuse an on-demand instance, idle on-demand "
                     "instances are stopped first, least recently used first, if that makes room; "
                     "an instance that is always on is never stopped for it."),
    )
    idle_stop_after: DurationOrNever = field(
        default=float("inf"),
        metadata=doc("An on-demand instance that has had no request for this long is stopped "
                     "through the termination ladder; the next request starts it again. A "
                     "request's own `keep_alive` (Ollama's API) may set this window, within the "
                     "bounds below.", minimum=0),
    )
    evictable: bool = field(
        default=True,
        metadata=doc("An idle on-demand instance may be stopped to make room for another "
                     "on-demand instance that memory admission would refuse (least recently "
                     "used first). `false` keeps it loaded, and that other start is refused "
                     "instead: a chat model that an embedding model starting on demand must "
                     "never evict. An always-on instance is never stopped for room."),
    )
    keep_alive: KeepAliveBounds = field(
        default_factory=KeepAliveBounds,
        metadata=doc("What a request's `keep_alive` (Ollama's API: a duration such as `5m`, a "
                     "number of seconds, `0` to stop the instance once no request is in "
                     "flight, or `-1` to keep it) may set an on-demand instance's idle window "
                     "to. The window a request sets lasts until the next request ends; one "
                     "that asks nothing restores `idle_stop_after`, but does not undo a `0` "
                     "asked while it ran. On an instance that is not on demand, `keep_alive` "
                     "has no effect. `exod check` prints each on-demand instance's window and "
                     "bounds."))
    hang_after: DurationOrNever = field(
        default=300.0,
        metadata=doc("While requests are in flight and the instance's runner sends nothing for "
                     "them (no generated text, and no chunk of a long prompt processed: the "
                     "runner reports each one) for this long, the instance is hung: status shows "
                     "`hung (no progress for 5m)`, `/ready` stops counting it as ready, its "
                     "requests in flight end with HTTP 503 and code `hung`, and it restarts "
                     "through the ladder, counted as a failure (so `restart` and `start_limit` "
                     "apply). A heartbeat is no progress: a runner stuck in a collective still "
                     "sends those. Loading is never timed: an instance has no request in flight "
                     "until it is ready. `never` disables it.", minimum=1),
    )
    context_tokens: int = field(
        default=4096,
        metadata=doc("The KV cache the memory estimate reserves for each of the `max_concurrency` "
                     "generations, in tokens (capped at the model's `max_position_embeddings`).",
                     minimum=1),
    )
    # `inherit` fields take their value from `defaults:`; a partial mapping given here
    # overrides only the keys it names.
    restart: RestartMode = field(
        default="on-failure",
        metadata=doc("This instance's restart policy (see `defaults.restart`).", inherit="restart"),
    )
    stop: StopPolicy = field(
        default_factory=StopPolicy,
        metadata=doc("This instance's termination ladder.", inherit="stop"),
    )
    backoff: BackoffPolicy = field(
        default_factory=BackoffPolicy,
        metadata=doc("This instance's restart backoff (see `defaults.backoff`).",
                     inherit="backoff"),
    )
    start_limit: StartLimit = field(
        default_factory=StartLimit,
        metadata=doc("This instance's start limit (see `defaults.start_limit`).",
                     inherit="start_limit"),
    )
    env: Mapping[str, str] = field(
        default_factory=dict,
        metadata=doc("Extra environment variables for the instance's runners. Names have letters, "
                     "digits and `_`, and do not start with a digit. A value is taken as written: "
                     '`DEBUG: yes` gives `yes`, `MASK: 0660` gives `0660`; write `""` for an '
                     "empty value. The variables exod sets for runners (see `exod`(8)) win over "
                     "these."),
    )
    hosts: tuple[Host, ...] = field(
        default=(),
        metadata=doc("The hosts the ranks run on, one per rank, in rank order. Empty: every rank "
                     "runs on this host. See MULTI-HOST in exod.yaml(5)."),
    )
    port_base: int | None = field(
        default=None,
        metadata=doc("Rank `r` listens on TCP port `port_base` + `r`, and rank 0 also on "
                     "`port_base` + `shards` (the group's control connections). Required when the "
                     "ranks run on several hosts; pick it outside the kernel's ephemeral port "
                     "range there, whose ports outgoing connections may hold. Null with every "
                     "rank on this host: free ports are picked at each start, outside the "
                     "ephemeral range and apart from those of the other groups and of every "
                     "`port_base`. The ranges of two instances must not overlap, and must end at "
                     "65535 at most.", minimum=1024, maximum=65535),
    )
    backend: Backend = field(
        default="ring",
        metadata=doc("The mx.distributed backend of a multi-rank instance. `mpi` is refused when "
                     "`shards` is more than 1: MPI forms a group only among ranks that mpirun "
                     "started, and exod starts and supervises each rank itself."),
    )
    peer_timeout: Duration = field(
        default=60.0,
        metadata=doc("Once a multi-rank group is ready, silence from the group for this long "
                     "means a peer is lost (a network partition, say): the ranks exit with code "
                     "76, restart, and form the group again. A group whose ranks all run on this "
                     "host must also form within it (30 seconds at least) once every rank is "
                     "joining, else it is restarted on new ports. Never applies while loading, "
                     "nor while a group across hosts forms.", minimum=0.5),
    )
    max_concurrency: int | None = field(
        default=None,
        metadata=doc("How many requests the instance generates for at once: the width of its "
                     "batch. They are decoded together (continuous batching); every rank of a "
                     "sharded instance runs the same batch. Unset, the width is sized by memory "
                     "admission at each start: as many generations as the KV cache of "
                     "`context_tokens` each fits beside the weights and the runtime in the memory "
                     "available (less `defaults.memory_headroom` and what running instances may "
                     "still take), at most 16 and at least 1. The log says which width was "
                     "chosen, and `exod check` shows it.", minimum=1, maximum=256),
    )
    prompt_cache_dir: Path | None = field(
        default=None,
        metadata=doc("The folder under which the instance keeps the prompt cache's disk tier, in "
                     "DIR/ID/NAME: ID names this daemon by its config file's path, so several "
                     "daemons may share DIR and none removes another's entries (`exoctl cache "
                     "clear` empties the instance's own folder).",
                     inherit="prompt_cache_dir"),
    )
    max_queue: int = field(
        default=16,
        metadata=doc("How many more requests may wait; beyond that the HTTP API answers 429. "
                     "On an instance that batches text, they wait in its runner, which starts "
                     "them by the keys' shares of the batch (`api.keys`: `weight`, `priority`); "
                     "else in order of arrival.", minimum=0),
    )
    max_tokens_cap: int | None = field(
        default=None,
        metadata=doc("The most tokens a request may ask for (`max_tokens`); null: the model's "
                     "context window (from its `config.json`). A request that asks for more gets "
                     "400; one that asks for nothing gets at most this.", minimum=1),
    )
    chat_template_kwargs: Mapping[str, JsonValue] = field(
        default_factory=dict,
        metadata=doc("Extra variables for the model's chat template, for every chat request to "
                     "this instance, e.g. `{enable_thinking: false}` for a model that thinks by "
                     "default. A request's own `chat_template_kwargs` override them key by key. "
                     "The names of the template call's own arguments (`tools`, "
                     "`add_generation_prompt`, `chat_template`, ...) cannot be set."),
    )
    drop_system_lines: tuple[str, ...] = field(
        default=(),
        metadata=doc("Lines dropped from the system prompt of every chat request to this "
                     "instance, before the chat template: each item is the start of such a line. "
                     "A line of a system (or developer) turn that starts with one is removed with "
                     "the blank lines that separate it from the rest, as if the client had not "
                     "sent it; a turn left empty goes. For text an agent writes atop its system "
                     "prompt that changes between requests or sessions and that the model does "
                     "not need: the prompt cache reuses only an exact prefix, so such a line "
                     "voids everything after it. `[\"x-anthropic-billing-header:\"]` drops "
                     "Claude Code's billing line, whose hash changes with each session's first "
                     "prompt: the prompt is then the one Claude Code sends with "
                     "`CLAUDE_CODE_ATTRIBUTION_HEADER=0`, and a new session reuses the system "
                     "prompt and tools from the cache. The model never sees a dropped line. "
                     "Empty (the default): the prompt is what the client sent.",
                     pattern=r"\A[^\n\r]{1,256}\Z"),
    )
    draft_hub: HubRef | None = field(
        default=None, kw_only=True,
        metadata=doc("the hub repository `draft_model` names, if any", internal=True))
    cluster_key_file: Path | None = field(
        default=None,
        metadata=doc("A file holding the group's secret: at least 16 bytes, the same file on "
                     "every host, a secret file as `api.token_file` is (other users can neither "
                     "read nor write it). Before a rank is let into its group, it and rank 0 "
                     "prove to each other that they hold it (an HMAC challenge-response on the "
                     "group's control connection). Required when the ranks run on several hosts; "
                     "null with every rank on this host: a fresh secret is made at each start."),
    )

    @property
    def always_on(self) -> bool:
        return self.autostart is True

    @property
    def on_demand(self) -> bool:
        return self.autostart == "on-demand"


@dataclass(frozen=True)
class Defaults:
    restart: RestartMode = field(
        default="on-failure",
        metadata=doc("What follows an exit nobody asked for. `no`: never restart (an exit with "
                     "code 0 leaves the instance stopped, any other exit failed). `on-failure`: "
                     "restart after a failure, not after an exit with code 0. `always`: restart "
                     "after any exit. Exit codes 64, 65, 69 and 78 are never retried (see "
                     "`exod`(8))."),
    )
    stop: StopPolicy = field(
        default_factory=StopPolicy,
        metadata=doc("The termination ladder, walked by every runner on every stop. Its worst "
                     "case before SIGKILL is `grace` + `attempts` × `interval`; keep the service "
                     "manager's stop timeout above it (`exod check` warns)."),
    )
    backoff: BackoffPolicy = field(
        default_factory=BackoffPolicy,
        metadata=doc("The delay before a restart, and before a download is tried again: "
                     "exponential, capped and jittered."),
    )
    start_limit: StartLimit = field(
        default_factory=StartLimit,
        metadata=doc("When to give up restarting."),
    )
    stall_after: Duration = field(
        default=60.0,
        metadata=doc("A load that makes no progress for this long is noted in the status as `no "
                     "progress for TIME`. Nothing is ever stopped for it.", minimum=0),
    )
    memory_headroom: Size = field(
        default=512 * 2**20,
        metadata=doc("Memory admission: before any runner of an instance starts, exod estimates "
                     "what this host's ranks will need (the safetensors headers of the layers "
                     "each rank owns, in the dtype it runs in, so `dtype: auto` doubles bfloat16 "
                     "weights on a CPU; KV cache for `max_concurrency` × `context_tokens`; and "
                     "the runtime) and compares it with what the host has available "
                     "(`MemAvailable` on Linux; on macOS three quarters of the RAM, an "
                     "approximation of the GPU's recommended working set) less this headroom and "
                     "less what running instances may still take. If it does not fit, the "
                     "instance goes to `failed` with the figures, e.g. `not enough memory: needs "
                     "64GiB, 21.3GiB available`, and no runner starts. KiB, MiB, GiB, TiB and K, "
                     "M, G, T are powers of 1024; KB, MB, GB, TB of 1000.", minimum=0),
    )
    prompt_cache_disk_bytes: Size = field(
        default=DEFAULT_PROMPT_CACHE_DISK_BYTES,
        metadata=doc("The `prompt_cache_disk_bytes` of every instance that sets none: 0 turns the "
                     "disk tier off everywhere.", minimum=0),
    )
    prompt_cache_dir: Path | None = field(
        default=None,
        metadata=doc("Where instances keep the prompt cache's disk tier, a folder per daemon and "
                     "instance (DIR/ID/NAME, ID a hash of the config file's path: daemons that "
                     "share DIR keep their own entries, and hold a lock on DIR/ID/.lock while "
                     "they run). Null: `prompt-cache` in the service's state directory "
                     "(`StateDirectory=`: /var/lib/exod/prompt-cache), else in its cache "
                     "directory (a user unit's `CacheDirectory=`: ~/.cache/exod/prompt-cache), "
                     "else /var/lib/exod/prompt-cache as root, else ~/.cache/exod/prompt-cache "
                     "(under `$XDG_CACHE_HOME` when set)."),
    )


@dataclass(frozen=True)
class Hub:
    """Models named by hub repository (`model: hf:ORG/NAME`)."""

    cache: Path | None = field(
        default=None,
        metadata=doc("The huggingface_hub cache folder models are fetched into (its own layout: "
                     "`models--ORG--NAME/{blobs,refs,snapshots}`). By default: `$HF_HUB_CACHE` "
                     "when set, else `$HF_HOME/hub` when `HF_HOME` is set (as huggingface_hub "
                     "reads them, for root too); else a service with a state directory keeps "
                     "its own, `$STATE_DIRECTORY/hub` (systemd's `StateDirectory=`), or "
                     "`/var/lib/exod/hub` as root; else the user's own cache, "
                     "`~/.cache/huggingface/hub`, shared with mlx-lm, so what it already "
                     "downloaded is not fetched twice. A snapshot of plain files instead of "
                     "links into `blobs/` (a cache copied with its links followed, or a file "
                     "system without links) is read too: checked against the hub's hashes when "
                     "the hub can be reached, else taken as it is, as mlx-lm would load it."),
    )
    offline: bool = field(
        default=False,
        metadata=doc("Never contact the hub: a cached model starts with no request, and a model "
                     "not in the cache fails with a one-line reason. Also when exod's own "
                     "environment sets `HF_HUB_OFFLINE=1`. With no network and false, the same "
                     "holds: a model not in the cache fails at once, saying the hub cannot be "
                     "reached, and `exoctl start` or a reload tries again; only a download "
                     "already under way (a partial file on disk) is retried with backoff."),
    )
    hf_token_file: Path | None = field(
        default=None,
        metadata=doc("A file holding the access token for gated or private repositories. A secret "
                     "file, as `api.token_file` is: other users can neither read nor write it "
                     "(exod refuses the config otherwise). Only the fetcher reads it: the token "
                     "is never in an argv, an environment, a runner, a log or the status."),
    )
    stall_after: Duration = field(
        default=60.0,
        metadata=doc("A download that sends no new byte for this long is shown as stalled, "
                     "stopped through the ladder and started again with backoff "
                     "(`defaults.backoff`); it is never given up.", minimum=1),
    )


@dataclass(frozen=True)
class Control:
    socket: Path = field(
        default_factory=default_control_socket,
        metadata=doc("Default: `$RUNTIME_DIRECTORY/control.sock` when `RUNTIME_DIRECTORY` is set "
                     "(systemd's `RuntimeDirectory=`), else `/run/exod/control.sock` for root "
                     "(`/var/run/exod/control.sock` on macOS), else "
                     "`$XDG_RUNTIME_DIR/exod/control.sock` (or `/tmp/exod-UID/control.sock` "
                     "without `XDG_RUNTIME_DIR`). Its folder is created if needed, mode 0700 "
                     "(0750 when a group may use the socket); exod refuses a folder that another "
                     "user owns or that is not a real folder, and binds the socket with its mode "
                     "already set. It refuses a `control.socket` that names an existing file, "
                     "folder or symlink that is not a socket (it would have to remove it). The "
                     "hostfiles and group secrets `groups/NAME.json` and `groups/NAME.key` (mode "
                     "0600, in a private folder) go in the same folder, and so does the socket "
                     "runners report to."),
    )
    mode: Octal = field(
        default=0o660,
        metadata=doc("The mode of the control socket: who may use `exoctl`. Besides the file's "
                     "mode, exod checks the user of each connection (SO_PEERCRED, LOCAL_PEERCRED "
                     "on macOS): exod's own user, root, and the members of `control.group` may "
                     "use it. `exod check` warns about a mode that lets every user write."),
    )
    group: str | None = field(
        default=None,
        metadata=doc("A group whose members may use the control socket; the socket and its folder "
                     "get that group. Null: exod's own group, when `control.mode` grants the "
                     "group access.", pattern=r"^[A-Za-z0-9._-]{1,64}$"),
    )
    max_connections: int = field(
        default=64,
        metadata=doc("Control connections open at once. Beyond it the oldest one that has not "
                     "sent its request yet is dropped; a request must arrive within 10 seconds of "
                     "connecting.", minimum=1, maximum=4096),
    )


@dataclass(frozen=True)
class Node:
    name: str = field(
        default_factory=socket.gethostname,
        metadata=doc("Default: the host name. The name of this host in the `hosts` lists of "
                     "multi-host instances; it tells exod which ranks to run here.",
                     pattern=r"^[A-Za-z0-9._-]{1,253}$"),
    )


DEFAULT_CLUSTER_PORT = DEFAULT_API_PORT + 1


@dataclass(frozen=True)
class Cluster:
    """Discovery: the exods that hold the same key find each other (docs/cluster.md)."""

    key_file: Path | None = field(
        default=None,
        metadata=doc("The cluster's key: a secret file as an instance's `cluster_key_file` is "
                     "(at least 16 bytes; other users can neither read nor write it), the same "
                     "file on every node (e.g. `openssl rand -hex 32 > FILE; chmod 600 FILE`, "
                     "then copy it to each node). Every announcement is signed with it (HMAC-"
                     "SHA256 over the whole record, with a time and a nonce); a node whose "
                     "announcement does not prove it is listed as `foreign` and never used. "
                     "Null (the default): this node takes part in no cluster."),
    )
    announce: bool = field(
        default=True,
        metadata=doc("With `key_file` set: announce this node and look for the others. False: "
                     "neither (the key is kept for the instances that name it)."),
    )
    mdns: bool = field(
        default=True,
        metadata=doc("Find nodes by mDNS/DNS-SD (service `_exod._tcp`, as Bonjour on a Mac "
                     "sees it) on the local network. False, where multicast is blocked: only "
                     "`peers` are asked."),
    )
    peers: tuple[str, ...] = field(
        default=(),
        metadata=doc("Seed addresses asked directly, with or without mDNS: `HOST` (the default "
                     "cluster port) or `HOST:PORT`, IPv6 in brackets (`[fd00::2]:52416`).",
                     pattern=r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?$"),
    )
    listen: str = field(
        default=f"0.0.0.0:{DEFAULT_CLUSTER_PORT}",
        metadata=doc("`HOST:PORT` where peers reach this node's cluster endpoint (TCP): an "
                     "exchange of signed announcements, answered only to a peer that proves the "
                     "key. Port 0 picks a free port (announced over mDNS).",
                     pattern=r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):[0-9]{1,5}$"),
    )
    interval: Duration = field(
        default=2.0,
        metadata=doc("How often each known node is asked for its announcement.",
                     minimum=0.1, maximum=3600),
    )
    peer_timeout: Duration = field(
        default=10.0,
        metadata=doc("A member not heard for this long is `stale`: shown, and not counted on "
                     "until it is heard again.", minimum=0.5),
    )
    max_clock_skew: Duration = field(
        default=60.0,
        metadata=doc("An announcement whose time is further than this from this node's clock is "
                     "refused (a replay, or a clock that needs NTP); a nonce seen within this "
                     "window is refused as replayed.", minimum=1, maximum=3600),
    )
    test_memory: Size | None = field(
        default=None,
        metadata=doc("FOR TESTS ONLY: announce this as the node's memory total (and this less "
                     "`defaults.memory_headroom` as usable) instead of what the host has, so "
                     "that several nodes on one machine look like machines of different sizes. "
                     "Never set it on a real cluster: placement would trust it.", minimum=0),
    )


@dataclass(frozen=True)
class Key:
    """One named key of the HTTP API (`api.keys`, or an item of `api.keys_file`). Its secret is
    never stored: only its hash, which `exoctl key new NAME` prints."""

    name: str = field(
        metadata=doc("The key's name, chosen by the operator: unique among the keys, and the "
                     "name logs, metrics and usage know it by (never by its secret).",
                     pattern=core_keys.NAME_RE))
    hash: str = field(
        metadata=doc("The secret's SHA-256, as `sha256:HEX` (`exoctl key new NAME` prints it, "
                     "and `exoctl key hash` makes it of a secret read from its input). Clients "
                     "send the secret itself: `Authorization: Bearer SECRET` or `x-api-key: "
                     "SECRET`.", pattern=core_keys.HASH_RE))
    owner: str = field(
        default="",
        metadata=doc("Whose key it is (a person, a team, a job): shown beside its name."))
    scopes: tuple[Scope, ...] = field(
        default=("infer",),
        metadata=doc("What the key may do. `infer`: the model endpoints (every dialect's "
                     "generation, embeddings, token counts and model lists, `/ready` and "
                     "`/status.json`); `manage`: pull and delete models; `admin`: everything, "
                     "`/metrics` (every key's figures) and every key's usage included. A "
                     "request outside its scopes gets 403 naming the scope it needs."))
    instances: tuple[str, ...] | None = field(
        default=None,
        metadata=doc("The instances the key may use, by name; null (the default): every "
                     "instance. Any other is unknown to it: a request that names one gets 404 "
                     "as for a model that does not exist, and model lists leave it out."))
    limits: KeyLimits = field(
        default_factory=KeyLimits,
        metadata=doc("What the key may use; a limit not set is no limit."))
    weight: float = field(
        default=1.0,
        metadata=doc("The key's share of a full batch, against the other keys' weights.",
                     above=0))
    priority: Priority = field(
        default="interactive",
        metadata=doc("`batch` work fills only what `interactive` work leaves of the batch."))


@dataclass(frozen=True)
class Api:
    listen: tuple[str, ...] = field(
        default=(f"127.0.0.1:{DEFAULT_API_PORT}",),
        metadata=doc("`HOST:PORT` to listen on, or a list of them, each served alike (the same "
                     "endpoints, tokens and limits), e.g. `[127.0.0.1:52415, 127.0.0.1:11434]` "
                     "to be found also on Ollama's port by apps that only know it: `HOST` is an "
                     "address or a host name, written in brackets for IPv6 (`[::1]:52415`); "
                     "port 0 picks any free port. An address may be listed only once. The empty "
                     'string `""` or an empty list turns the API off. Other machines reach the '
                     "API only when `HOST` lets them, e.g. `0.0.0.0:52415`; exod never listens "
                     "on every address by default.",
                     pattern=r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):[0-9]{1,5}$"),
    )
    token_file: Path | None = field(
        default=None,
        metadata=doc("A file of bearer tokens, one per line (blank lines and lines starting with "
                     "`#` are skipped), one of which every request but `GET /health` must send "
                     "(`Authorization: Bearer TOKEN`). It is read when exod starts, and again at "
                     "each reload (a rotated token needs no restart; a reload that cannot read it "
                     "keeps the previous tokens); exod does not start when the file cannot be "
                     "read or holds no token. It is a secret file, as every file exod reads a "
                     "secret from: a regular file that other users can neither read nor write "
                     "(mode 0600, or 0640 to let the users who may use `exoctl chat` read it "
                     "through its group); exod refuses any other."),
    )
    keys: tuple[Key, ...] = field(
        default=(),
        metadata=doc("Named keys, each with its owner, scopes, instances and limits (see "
                     "docs/keys.md). Any key, token or keys file turns auth on: every request "
                     "but `GET /health` must then send a secret of one of them. A reload reads "
                     "the keys again: a key removed stops working at once, a stream under way "
                     "included, and a changed key's limits apply to its next requests."))
    keys_file: Path | None = field(
        default=None,
        metadata=doc("A YAML file holding more keys: a list written as `api.keys` is. A secret "
                     "file, as `api.token_file` is (other users can neither read nor write it), "
                     "read when exod starts and again at each reload: a reload that cannot read "
                     "it, or finds a problem in it, keeps the previous keys and says why. Set, "
                     "it turns auth on even while it holds no key."))
    insecure_public: bool = field(
        default=False,
        metadata=doc("`exod run` refuses an `api.listen` that other machines can reach (anything "
                     "but a loopback address) without `api.token_file`, unless this is true; "
                     "`exod check` warns about it either way."),
    )
    allowed_hosts: tuple[str, ...] = field(
        default=(),
        metadata=doc("Names accepted in the `Host` header besides IP addresses, `localhost`, "
                     "`*.localhost` and the listen address; other names get 421. This defeats DNS "
                     "rebinding: a web page whose name is made to point at 127.0.0.1 cannot use "
                     'the API. `"*"` accepts every name.'),
    )
    cors_origins: tuple[str, ...] = field(
        default=(),
        metadata=doc("Web origins, such as `https://app.example`, that may call the API from a "
                     "browser (CORS); default none, and no Access-Control headers are ever sent. "
                     '`"*"` allows every origin. Independently, POST requests must be '
                     "`Content-Type: application/json`, which a web page cannot send to another "
                     "origin without CORS's permission."),
    )
    max_body_kib: int = field(
        default=4096,
        metadata=doc("The largest request body, in KiB; a larger one gets 413, by its "
                     "Content-Length before it is read. The reasoning a request sends back "
                     "sealed (Responses' `encrypted_content`, Anthropic's thinking `signature`) "
                     "opens to no more text than this, all its seals together; past it, a 400 "
                     "names the seal.", minimum=1, maximum=262144),
    )
    max_connections: int = field(
        default=256,
        metadata=doc("HTTP connections open at once. At the limit a new connection closes the "
                     "oldest idle one (between requests, or still sending its request head); when "
                     "every connection has a request in progress, the new one gets 503.",
                     minimum=1, maximum=65536),
    )
    header_timeout: Duration = field(
        default=10.0,
        metadata=doc("A connection must send a whole request head within this long from its start "
                     "or from its previous answer, else it is closed.", minimum=0.1),
    )
    body_timeout: Duration = field(
        default=30.0,
        metadata=doc("A request body must arrive within this long, else 408.", minimum=0.1),
    )
    strict_fields: bool = field(
        default=False,
        metadata=doc("Refuse (400, naming it) a request field exod does not know. By default such "
                     "a field is accepted and has no effect: it is logged once, counted in "
                     "`exod_ignored_fields_total` and named in the answer's "
                     "`x-exod-ignored-fields` header, as new client versions keep adding fields. "
                     "Tools that only the cloud runs (web search and the like) are never refused "
                     "either way: they are not offered to the model, and reported."),
    )
    image_urls: bool = field(
        default=True,
        metadata=doc("fetch the http(s) URLs of pictures that requests name (for models that "
                     "see): never from an address that is not global (private, loopback, "
                     "link-local, reserved, an IPv4 one disguised in IPv6), nor through a "
                     "redirect to one; false refuses such a picture (400, naming it): clients "
                     "must then send the bytes (base64)"),
    )
    image_url_timeout: Duration = field(
        default=10.0,
        metadata=doc("a picture's URL must answer with the whole picture (at most 20 MiB) "
                     "within this long, redirects included, else the request gets 400",
                     minimum=0.1, maximum=300),
    )
    image_url_allow: tuple[Network, ...] = field(
        default=(),
        metadata=doc("private networks whose pictures may be fetched all the same (an image "
                     "server on the LAN: 10.1.2.0/24), as addresses or networks"),
    )
    max_request_megapixels: int = field(
        default=REQUEST_MEGAPIXELS,
        metadata=doc("The pixels of a request's pictures together, in megapixels (for models "
                     "that see), read from each picture's header before the request is queued; "
                     "past it, a 400 names each picture with its size. Each picture is decoded "
                     "whole before it is reduced to the model's resolution, so this bounds the "
                     "time a request's pictures take to decode (about 1 s for 100 megapixels "
                     "of PNG or WebP on one core, far less of JPEG); a picture alone may have "
                     "50 megapixels at most.",
                     minimum=1, maximum=MAX_IMAGES * MAX_PIXELS // 1_000_000),
    )


@dataclass(frozen=True)
class UsageLog:
    """What exod keeps of each key's use (docs/usage.md)."""

    folder: Path | None = field(
        default=None,
        metadata=doc("The folder of the usage log (`usage-NNNNNNNN.jsonl`: a JSON line per "
                     "finished request), the audit log (`audit-NNNNNNNN.jsonl`: a line per "
                     "`manage` or `admin` action) and the quotas' checkpoint (`quota.json`). "
                     "Null: `usage` in the state folder (`$STATE_DIRECTORY/usage` under "
                     "systemd's `StateDirectory=`, else `$XDG_STATE_HOME/exod/usage`, else "
                     "/var/lib/exod/usage as root, else ~/.local/state/exod/usage). exod makes "
                     "it mode 0700 and its files 0600, whatever the umask. Read at start."),
    )
    max_file_mib: int = field(
        default=16,
        metadata=doc("A log's file is closed and a new one begun past this size, in MiB.",
                     minimum=1, maximum=4096),
    )
    keep_files: int = field(
        default=8,
        metadata=doc("Files kept of each log; the oldest is removed past it (what it counted "
                     "toward the quotas is kept in `quota.json` first).",
                     minimum=1, maximum=10000),
    )


@dataclass(frozen=True)
class Config:
    """A whole, validated configuration: the main file plus its includes."""

    path: Path = field(metadata=doc("the main file this config was read from", internal=True))
    node: Node = field(default_factory=Node, metadata=doc("This host."))
    control: Control = field(
        default_factory=Control,
        metadata=doc("The control socket that `exoctl`(1) uses."),
    )
    ready: ReadyPolicy = field(
        default="daemon",
        metadata=doc("When exod tells the service manager READY=1, which is when `systemctl start "
                     "exod` returns. `daemon:` once the control socket is up and every instance "
                     "with `autostart: true` has been started. `instances:` once every such "
                     "instance has settled, ready or failed (or stopped); meanwhile, for as long "
                     "as a runner of such an instance lives, exod extends systemd's start timeout "
                     "every few seconds from the spawn on (the import, the wait for peers, a "
                     "layer that takes an hour), so the start lasts as long as the load, however "
                     "long that is. Only a stuck exod lets `TimeoutStartSec` fire. That is why "
                     "`daemon` is the default."),
    )
    api: Api = field(default_factory=Api, metadata=doc("The OpenAI-compatible HTTP API."))
    cluster: Cluster = field(
        default_factory=Cluster,
        metadata=doc("Discovery of the other exods that hold the same cluster key "
                     "(docs/cluster.md)."),
    )
    hub: Hub = field(
        default_factory=Hub,
        metadata=doc("Models named by hub repository (`model: hf:ORG/NAME`)."),
    )
    usage: UsageLog = field(
        default_factory=UsageLog,
        metadata=doc("The usage log, the audit log and the quotas kept across restarts."),
    )
    defaults: Defaults = field(
        default_factory=Defaults,
        metadata=doc("Daemon-wide defaults; every instance inherits `restart`, `stop`, `backoff` "
                     "and `start_limit` from here."),
    )
    include: tuple[str, ...] = field(
        default=(),
        metadata=doc("Glob patterns of drop-in files that hold more `instances` (see Includes in "
                     "exod.yaml(5))."),
    )
    instances: Mapping[str, Instance] = field(
        default_factory=dict,
        metadata=doc("The instances, each under its name: one model each, served by one rank or "
                     "several (runner processes)."),
    )

    def stop_policies(self) -> list[StopPolicy]:
        """Every stop ladder this config declares: each instance's and the defaults'."""
        return [*(i.stop for i in self.instances.values()), self.defaults.stop]
