"""A zoo of tiny models, one per mlx-lm text family, made from mlx-lm's own classes.

Each family's model is built from a small config (a shared base plus what the family needs)
with the `Model` and `ModelArgs` of the mlx-lm module that mlx_lm.load would pick for it
(`model_classes`), given seeded random weights, optionally quantized, and saved as a real model
directory next to the tiny test tokenizer (tests.models.tiny), so `mlx_lm.load` loads it as it
would a checkpoint. Nothing is downloaded and nothing binary is
kept in the repository: tests and `python -m bench families` make the zoo when they need it.

`FAMILIES` maps each family exod tests to its config; `NOT_TINY` lists mlx-lm modules that are
not in the zoo, with the reason.
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path
from typing import Any

import click

from exod.models._io import build_atomically, write_json
from tests.models.zoo_families import (  # noqa: F401 -- the zoo's public names
    BASE,
    FAMILIES,
    KNOWN_REFUSALS,
    NOT_SERVED,
    NOT_TINY,
    QUANTIZED,
    VOCAB,
)

GENERATOR_VERSION = 2


def family_config(family: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    extra = {**FAMILIES[family], **(overrides or {})}
    config = {**BASE, **extra, "model_type": family}
    if "text_config" in extra:  # a multimodal wrapper: the text model keeps the settings
        text = {**BASE, "model_type": f"{family}_text", **extra["text_config"]}
        outer = {k: v for k, v in extra.items() if k != "text_config"}
        config = {"vocab_size": text["vocab_size"], **outer, "model_type": family,
                  "text_config": text}
    config.update({"bos_token_id": 1, "eos_token_id": 2})
    return config


def make_family_model(out_dir: Path, family: str, *, bits: int | None = None,
                      seed: int = 0, overrides: dict[str, Any] | None = None,
                      force: bool = False) -> Path:
    """Make (or reuse) the tiny model of `family` at `out_dir`; `bits` quantizes it;
    `overrides` change its config (benchmarks make bigger ones)."""
    if family not in FAMILIES:
        raise ValueError(f"no tiny config for family {family!r}")
    params = {"generator": "tests.models.zoo", "version": GENERATOR_VERSION, "family": family,
              "bits": bits, "seed": seed, "config": FAMILIES[family],
              "overrides": overrides or {}}
    return build_atomically(Path(out_dir), params,
                            lambda d: _build(family, bits, seed, overrides, d), force=force)


def _build(family: str, bits: int | None, seed: int, overrides: dict[str, Any] | None,
           out: Path) -> None:
    import mlx.core as mx
    from mlx import nn
    from mlx.utils import tree_flatten

    config = family_config(family, overrides)
    model_cls, args_cls = model_classes(config["model_type"])
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    _silence_unknown_tokens(model, int(config.get("vocab_size") or VOCAB))
    if bits is not None:
        nn.quantize(model, group_size=32, bits=bits)
        config["quantization"] = {"group_size": 32, "bits": bits}
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    write_json(out / "config.json", config)
    copy_tokenizer(out)


def model_classes(model_type: str) -> tuple[Any, Any]:
    """(Model, ModelArgs) of the mlx-lm module that serves `model_type`, chosen as mlx_lm.load
    chooses it: by module name, after mlx-lm's public MODEL_REMAPPING (mistral is llama's).
    Its architecture-based remapping is left out: no zoo config names an architecture."""
    from mlx_lm.utils import MODEL_REMAPPING

    name = MODEL_REMAPPING.get(model_type, model_type)
    try:
        module = importlib.import_module(f"mlx_lm.models.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"mlx_lm.models.{name}":
            raise  # the module exists but needs a package that is missing
        raise ValueError(f"mlx-lm has no module for model type {model_type!r}") from e
    return module.Model, module.ModelArgs


def _silence_unknown_tokens(model: Any, vocab: int) -> None:
    """A family whose vocabulary must be larger than the tiny tokenizer's (phi3small masks
    fixed high ids): zero rows for the ids the tokenizer lacks give them a logit of 0, below
    the best of 1024 random logits, so greedy decoding never picks a token it cannot show."""
    import mlx.core as mx
    from mlx.utils import tree_unflatten

    from exod.runner.split.blocks import flat_arrays

    if vocab <= VOCAB:
        return
    keep = (mx.arange(vocab) < VOCAB)[:, None]
    tables = [(k, mx.where(keep, v, 0)) for k, v in flat_arrays(model.parameters())
              if v.ndim == 2 and v.shape[0] == vocab]
    model.update(tree_unflatten(tables))


def copy_tokenizer(out: Path) -> None:
    """The tiny test tokenizer (vocab 1024), trained once and copied into every model."""
    from tests.models.tiny import _write_tokenizer

    cache = out.parent / ".zoo-tokenizer"
    if not (cache / "tokenizer_config.json").is_file():
        tmp = out.parent / f".zoo-tokenizer.{out.name}"
        tmp.mkdir(parents=True, exist_ok=True)
        _write_tokenizer(BASE["vocab_size"], tmp)
        try:
            tmp.rename(cache)
        except OSError:  # another builder won
            shutil.rmtree(tmp, ignore_errors=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(cache / name, out / name)


def reference_text(model_dir: Path, prompt: str, max_tokens: int, ban: int) -> str:
    """What in-process mlx-lm generates, greedily, with token `ban` made impossible (as a
    client's logit_bias of -100 does), in float32 as the runner computes on CPU."""
    import mlx.core as mx
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_logits_processors

    model, tokenizer = load(str(model_dir))[:2]
    model.set_dtype(mx.float32)
    processors = make_logits_processors(logit_bias={ban: -100.0})
    return "".join(r.text for r in stream_generate(
        model, tokenizer, prompt, max_tokens=max_tokens, sampler=lambda x: mx.argmax(x, -1),
        logits_processors=processors))


def zoo_name(family: str, bits: int | None) -> str:
    return family if bits is None else f"{family}-q{bits}"


def parse_sets(sets: tuple[str, ...]) -> dict[str, Any]:
    """The `--set KEY=JSON` options, as a dict (a usage error for JSON that does not parse)."""
    try:
        return {k: json.loads(v) for k, _, v in (x.partition("=") for x in sets)}
    except ValueError as e:
        raise click.UsageError(f"--set: {e}") from e


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("root", type=click.Path(file_okay=False, path_type=Path))
@click.argument("families", nargs=-1)
@click.option("--prompt", default=None, help="Also generate greedily from this prompt.")
@click.option("--max-tokens", default=12, show_default=True)
@click.option("--ban", default=2, show_default=True, help="Token id never generated (EOS).")
@click.option("--set", "sets", multiple=True, metavar="KEY=JSON",
              help="Override a config key (for bigger models), e.g. --set hidden_size=1024.")
def main(root: Path, families: tuple[str, ...], prompt: str | None, max_tokens: int,
         ban: int, sets: tuple[str, ...]) -> None:
    """Make the tiny models of FAMILIES (FAMILY or FAMILY:BITS; default: every family) under
    ROOT; print one JSON object: name -> {"path", and with --prompt "text"}."""
    overrides = parse_sets(sets)
    out: dict[str, dict[str, str]] = {}
    for spec in families or tuple(FAMILIES):
        family, _, bits_text = spec.partition(":")
        bits = int(bits_text) if bits_text else None
        name = zoo_name(family, bits)
        try:
            path = make_family_model(root / name, family, bits=bits, overrides=overrides)
        except ValueError as e:
            raise click.UsageError(str(e)) from e
        out[name] = {"path": str(path)}
        if prompt is not None:
            out[name]["text"] = reference_text(path, prompt, max_tokens, ban)
    click.echo(json.dumps(out))


if __name__ == "__main__":
    main()
