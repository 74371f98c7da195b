"""An instance checked against its model's own files (exod.facts): an embedding model, a reranker
or a model that sees, configured in a way exod cannot serve; and `exod check`'s line for an
encoder. The facts are read in exod.facts; what the operator is told of them is said here."""

from __future__ import annotations

from exod.config.checks import Issue
from exod.config.schema import Instance
from exod.facts.embed import ENDPOINTS, encoding
from exod.facts.extra import INSTALL, have_extra
from exod.facts.vision import SPLIT_BY_LAYERS, extra_problem, sees


def check_embed(instance: Instance) -> list[Issue]:
    """An embedding or reranker model exod cannot serve as configured: without the extra, split
    across ranks, with generation options, or with files exod cannot follow."""
    if instance.hub is not None:  # not on disk yet: the runner says so once it is fetched
        return []
    enc = encoding(instance.model)
    if enc is None:
        return []
    what = "an embedding model" if enc.role == "embed" else "a reranker"
    if enc.problem is not None:
        return [Issue("model", f"{instance.model} is {what} exod cannot serve: {enc.problem}")]
    if not have_extra():
        return [Issue("model", f"{instance.model} is {what} ({enc.why}): serving it needs the "
                               f"optional extra exod[vision] (mlx-vlm), which is not installed: "
                               f"{INSTALL}")]
    if instance.shards > 1:
        return [Issue("shards", f"{what} runs on one rank; serve it with shards: 1")]
    for key in ("kv_bits", "max_kv_size", "draft_model", "adapters"):
        if getattr(instance, key) is not None:
            return [Issue(key, f"{key} is a generation option: {what} generates no tokens")]
    return []


def check_vision(instance: Instance) -> list[Issue]:
    """A model that sees, without the extra, or split other than by layers (whether its
    layers split is the split probe's question, as for text: exod.runner.split.probe)."""
    if instance.hub is not None:  # not on disk yet: the runner says so once it is fetched
        return []
    problem = extra_problem(instance.model)
    if problem is not None:
        return [Issue("model", problem)]
    if instance.shards > 1 and instance.parallelism != "pipeline" \
            and sees(instance.model) is not None:
        return [Issue("parallelism", SPLIT_BY_LAYERS)]
    return []


def describe_encoder(instance: Instance) -> list[str]:
    """`exod check`'s line for an embedding or reranker instance: what it serves and how its
    files say vectors are made."""
    if instance.hub is not None:
        return []
    enc = encoding(instance.model)
    if enc is None or enc.problem is not None:
        return []
    if enc.role == "rerank":
        return [f"{instance.name}: serves {ENDPOINTS['rerank']}: {enc.why}; inputs of at most "
                f"{enc.max_tokens} tokens"]
    pooling = (enc.pooling or {}).get("pooling_mode", "the family's own")
    sizes = ("" if enc.matryoshka is None else "; may be cut to any size" if
             enc.matryoshka == "any" else
             f"; may be cut to {', '.join(map(str, enc.matryoshka))}")
    return [f"{instance.name}: serves {ENDPOINTS['embed']}: {enc.why}; {pooling} pooling, "
            f"{'normalized' if enc.normalize else 'not normalized'}, {enc.dimensions} "
            f"dimensions{sizes}; inputs of at most {enc.max_tokens} tokens"]
