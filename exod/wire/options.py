"""What a runner reads of its instance's settings, declared once: the runner's start-up spec
(`exod.wire.specs.RunnerSpec`) carries them whole and checks them field by field on arrival, and
the config schema's `Instance` inherits them, so an operator writes them as keys of an instance
like any other (`exod.config.schema`). Here, below the config, so the wire needs nothing of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from exod.core.kinds import ModelDir, Size, doc
from exod.core.serving import (DEFAULT_KV_GROUP_SIZE, DEFAULT_NUM_DRAFT_TOKENS,
                               DEFAULT_PROMPT_CACHE_BYTES, DEFAULT_PROMPT_CACHE_DISK_BYTES,
                               DEFAULT_QUANTIZED_KV_START)

DType = Literal["auto", "float32", "bfloat16", "float16"]
Backend = Literal["ring", "mpi"]
KvBits = Literal[2, 3, 4, 5, 6, 8]  # what mx.quantize takes
KvGroupSize = Literal[32, 64, 128]


@dataclass(frozen=True)
class GrammarLimits:
    """Bounds on the grammars of constrained decoding (response_format json_schema, forced tool
    calls): a schema past them is refused with a 400, in bounded time and memory."""

    max_schema_kib: int = field(
        default=64,
        metadata=doc("KiB a request's schemas may take as compact JSON (the `response_format` "
                     "schema, or the parameters of all its tools together); checked by the daemon "
                     "before the runner sees the request.", minimum=1, maximum=1 << 20),
    )
    max_size: int = field(
        default=200_000,
        metadata=doc("Symbols of a compiled grammar (llguidance's max_grammar_size); thousands of "
                     "alternatives in one schema pass it.", minimum=1000, maximum=10_000_000),
    )
    max_lexer_states: int = field(
        default=50_000,
        metadata=doc("States of a grammar's lexer, about 1 to 2 KB of memory each: the bound on a "
                     "grammar's memory.", minimum=1000, maximum=10_000_000),
    )
    compile_fuel: int = field(
        default=1_000_000,
        metadata=doc("Lexer work allowed to compile a grammar (about 50,000 a millisecond): the "
                     "bound on a compile's time.", minimum=10_000, maximum=1_000_000_000),
    )
    step_fuel: int = field(
        default=200_000,
        metadata=doc("Lexer work allowed to compute one token's mask (about 14,000 a "
                     "millisecond); a generation whose grammar runs out of it ends.",
                     minimum=10_000, maximum=1_000_000_000),
    )


@dataclass(frozen=True, kw_only=True)
class RunnerOptions:
    """What a runner reads of its instance's settings: how it loads the model and serves. Each
    rank gets them whole in its start-up spec (`exod.wire.specs.RunnerSpec`), checked field by field
    on arrival against these very types, so an option added here reaches every runner with its
    default, bounds and choices declared once. `Instance` inherits them: in the YAML they are
    keys of an instance like any other."""

    dtype: DType = field(
        default="auto",
        metadata=doc("The type the weights are cast to. `auto` is float32 on the CPU, where it is "
                     "the fast path, and the weights' own type on a GPU."),
    )
    prompt_cache_bytes: int = field(
        default=DEFAULT_PROMPT_CACHE_BYTES,
        metadata=doc("Bytes of KV cache kept in RAM from finished requests, so that a request "
                     "which starts as an earlier one did (the next turn of a chat) prefills only "
                     "what is new. Least recently used entries are evicted first, to the disk "
                     "tier (`prompt_cache_disk_bytes`); 0 disables the RAM tier. In a sharded "
                     "instance the cap counts rank 0's bytes, and the other ranks keep the same "
                     "entries.", minimum=0, maximum=1 << 50),
    )
    prompt_cache_disk_bytes: Size = field(
        default=DEFAULT_PROMPT_CACHE_DISK_BYTES,
        metadata=doc("The prompt cache's disk tier: bytes of KV cache kept as files under "
                     "`prompt_cache_dir`, so that a restart, an upgrade, a crash, an idle stop, "
                     "an eviction or a reboot loses nothing: the first request whose prompt "
                     "starts as a kept entry did loads it instead of prefilling it. Entries are "
                     "written behind the requests, never in their way: when they leave RAM, when "
                     "the instance is idle, and at a stop, within rung 1 of the ladder (what does "
                     "not fit before `stop.grace` is dropped, never waited for). A load runs like "
                     "prefill, a bounded part each step: a cancel or a stop ends it. Least "
                     "recently used entries go first; writes also leave the filesystem min(1 "
                     "GiB, 5%) free. Each entry is kept under a fingerprint of everything that "
                     "makes its KV valid: the weights by content (the SHA-256 of config.json and "
                     "the safetensors files, hashed once and recorded by each file's inode, "
                     "size, mtime and ctime, beside the files when their folder is writable, else "
                     "in the instance's folder), the adapters, dtype, KV quantization and "
                     "`max_kv_size`, the rank's layers in a group, the mlx and mlx-lm versions "
                     "and exod's cache format. Any change is a miss, and the folders of other "
                     "fingerprints are removed at the next start. A prefix is matched by its "
                     "tokens, compared in full. Files are written to a temporary name and "
                     "renamed (mode 0600, folders 0700), and carry a CRC: a full disk, an "
                     "unwritable folder, or a file cut short, corrupt or unreadable is a miss "
                     "and one log line, never a failed request. Each rank of a group keeps its "
                     "own layers' part, up to this many bytes; a hit needs every rank to hold "
                     "the entry, else it is a miss on every rank. With `draft_model` an entry "
                     "holds the draft's KV beside the model's. An instance served by turns "
                     "(`draft_model` with `kv_bits`, a family mlx-lm cannot batch) keeps no "
                     "prompt cache, in RAM or on disk; a model that sees keeps its cache in RAM "
                     "only, "
                     "and an embedding model or a reranker keeps none (written on such an "
                     "instance, this key is refused). 0 disables the disk tier.", minimum=0,
                     inherit="prompt_cache_disk_bytes"),
    )
    warm: tuple[Path, ...] = field(
        default=(),
        metadata=doc("Prompt files prefilled into the prompt cache at each start, unless it "
                     "holds them already (an agent's system prompt and tools, so that its first "
                     "request after a start finds them cached). A file is JSON, an object with "
                     "`messages` (chat turns, as a chat completions request has them) and "
                     "optionally `tools` (function tools), or plain text, one system message. "
                     "Its prompt is the model's chat template over those turns without an "
                     "assistant's turn after them, with `chat_template_kwargs`. A file that "
                     "cannot be read or is no such prompt is a config error. Not for a model "
                     "that sees, an embedding model or a reranker (refused there)."),
    )
    grammar: GrammarLimits = field(
        default_factory=GrammarLimits,
        metadata=doc("Bounds of constrained decoding (a `response_format` schema, a forced tool "
                     "call): a schema past them gets 400 naming the field, in bounded time and "
                     "memory, while other requests go on."),
    )
    # mlx-lm's generation options (exod.config.mlx_options checks what goes with what).
    kv_bits: KvBits | None = field(
        default=None,
        metadata=doc("Null: a float cache. Else, quantize the KV cache to this many bits a value "
                     "(mlx-lm's `kv_bits`; 4 or 8 are usual): about a quarter (8 bits) or an "
                     "eighth (4 bits) of a float32 cache, plus a scale and a bias per group. "
                     "Memory admission counts the quantized size (and, for a cache not quantized "
                     "yet, the float one). The instance batches its requests as any other, with "
                     "its prompt cache in RAM and on disk holding quantized entries. Not with "
                     "`max_kv_size`, nor with shards > 1."),
    )
    kv_group_size: KvGroupSize = field(
        default=DEFAULT_KV_GROUP_SIZE,
        metadata=doc("With `kv_bits`: how many values share a scale and a bias. It must divide "
                     "the model's head dimension (`head_dim`, else hidden_size / "
                     "num_attention_heads); `exod check` says so when it does not. Refused "
                     "without `kv_bits`."),
    )
    quantized_kv_start: int = field(
        default=DEFAULT_QUANTIZED_KV_START,
        metadata=doc("With `kv_bits`: a generation's cache stays in float until it holds this "
                     "many tokens, then is quantized (mlx-lm's default); 0 quantizes after the "
                     "first prefill chunk, as mlx-lm does. A batch holds one kind of cache: once "
                     "any request in it holds this many tokens, every request in it is "
                     "quantized. Refused without `kv_bits`.", minimum=0),
    )
    max_kv_size: int | None = field(
        default=None,
        metadata=doc("Null: the cache grows with the generation. Else, a rotating KV cache of "
                     "this many tokens per generation (mlx-lm's `max_kv_size`): once full, the "
                     "oldest tokens but the first 4 are overwritten, so a generation runs past it "
                     "in bounded memory, forgetting what it overwrote. Memory admission counts at "
                     "most this many tokens a generation. The instance still batches. For the "
                     "families whose caches mlx-lm makes itself (llama among them, where mlx-lm "
                     "would ignore the option), each plain KV cache becomes the rotating one; a "
                     "family's own sliding-window caches stay as they are, and a model with no "
                     "plain KV cache fails to start with the reason. Not with `kv_bits` (mlx-lm "
                     "cannot quantize a rotating cache) nor `draft_model` (a rejected draft "
                     "rewinds the cache, which a full rotating cache cannot), nor with shards > "
                     "1.",
                     # past int32, mlx's batch step fails (std::bad_cast) on every request
                     minimum=8, maximum=1 << 30),
    )
    draft_model: ModelDir | None = field(
        default=None,
        metadata=doc("Speculative decoding: a small model of the same tokenizer drafts "
                     "`num_draft_tokens` tokens, the model checks them in one step and keeps "
                     "those it would have generated itself, so the answer is the model's own, "
                     "sooner. A directory, or a hub name (`hf:ORG/NAME[@REVISION]`), fetched into "
                     "the cache as `model` is, after it (the instance stays `downloading` until "
                     "both are there). Its weights and KV cache count in memory admission. The "
                     "instance still batches: at each step every request in the batch is "
                     "drafted and checked, each keeps its own number of drafts, and the prompt "
                     "cache keeps the draft's KV beside the model's, in RAM and on disk. Greedy "
                     "requests get the model's own tokens, sampling ones its distribution, "
                     "logprobs are the model's; a request with a grammar (`response_format`, a "
                     "forced tool call), a thinking budget or a `seed` is decoded in the same "
                     "batch without drafts (one token a step, exactly as without a draft). With "
                     "`kv_bits` the instance serves by turns instead. The share of drafted "
                     "tokens accepted is in `exoctl status` (its JSON's `serving.speculative`) "
                     "and in `/metrics` (`exod_draft_tokens_total`, "
                     "`exod_draft_tokens_accepted_total`). A draft whose vocabulary differs from "
                     "the model's is refused. Not with `max_kv_size` nor with shards > 1 (a "
                     "group's ranks replay rank 0's batch steps, which know no draft)."),
    )
    num_draft_tokens: int = field(
        default=DEFAULT_NUM_DRAFT_TOKENS,
        metadata=doc("With `draft_model`: tokens drafted a step. Refused without `draft_model`.",
                     minimum=1, maximum=64),
    )
    adapters: Path | None = field(
        default=None,
        metadata=doc("A LoRA (or DoRA) adapter folder, as `mlx_lm.lora` writes it "
                     "(`adapter_config.json` and `adapters.safetensors`), applied to the model at "
                     "load (mlx-lm's `adapter_path`). Not with shards > 1."),
    )
    wired_limit: Size | None = field(
        default=None,
        metadata=doc("macOS only: how much memory mlx keeps wired on Metal, so that the weights "
                     "are not paged out between tokens (`mx.set_wired_limit`). Null: the GPU's "
                     "recommended working set, as mlx_lm.server sets it; 0: nothing kept wired "
                     "(mlx's own default); a size larger than the recommended working set fails "
                     "the start with the figures. Refused on other systems, which have no such "
                     "limit."),
    )
