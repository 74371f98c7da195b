"""mlx-lm's generation options of a text runner (a quantized or rotating KV cache, a draft
model), each checked against the loaded model before READY."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exod.runner.failures import ModelError
from exod.runner.link.log import log
from exod.runner.runner import Runner
from exod.wire import messages as m
from exod.wire.options import RunnerOptions

if TYPE_CHECKING:
    from exod.runner.load import Loaded
    from exod.runner.serving.gen_options import Draft, KvOptions


def options_reason(opts: RunnerOptions) -> str | None:
    """An option mlx-lm runs only without batching: the rule `exod check` shows. A draft model
    alone batches (exod.runner.serving.speculative)."""
    from exod.config.mlx_options import turn_reason

    return turn_reason(opts)


def generation_options(r: Runner, loaded: Loaded) -> tuple[KvOptions, Draft | None]:
    """The KV cache options and the draft model, each checked against the model (a
    ModelError says why one cannot work, before READY)."""
    from exod.runner.serving.gen_options import Draft, KvOptions
    from exod.runner.serving.model_checks import model_vocab
    from exod.runner.text.load import load_draft

    opts = r.options
    kv = KvOptions(opts.kv_bits, opts.kv_group_size, opts.quantized_kv_start, opts.max_kv_size)
    why = kv.problem(loaded.model)
    if why is not None:
        raise ModelError(why)
    if opts.draft_model is None:
        return kv, None
    r.report.status(m.Phase.LOADING, f"loading the draft model {opts.draft_model}")
    draft = Draft(load_draft(opts.draft_model, loaded.dtype), opts.num_draft_tokens)
    why = draft.problem(loaded.model, model_vocab(loaded.model), model_vocab(draft.model))
    if why is not None:
        raise ModelError(why)
    log(f"speculative decoding with {opts.draft_model}, {opts.num_draft_tokens} draft tokens")
    return kv, draft


def group_problem(opts: RunnerOptions) -> str | None:
    """Why a group (shards > 1) cannot run these options, if it cannot. A draft model: the
    other ranks replay rank 0's batch steps (exod.runner.group.lockstep), which know nothing
    of a speculative step's draft forwards, accepted counts and per-row rewinds."""
    if any(v is not None for v in (options_reason(opts), opts.kv_bits, opts.max_kv_size,
                                   opts.adapters, opts.draft_model)):
        return "kv_bits, max_kv_size, draft_model and adapters are not supported with shards > 1"
    return None
