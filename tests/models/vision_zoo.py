"""A zoo of tiny vision models, one per mlx-vlm family users run, made from mlx-vlm's own
classes, as tests.models.zoo makes the text families from mlx-lm's.

Each family's model (tests.models.vision_families) is built from its config with the `Model` of
the mlx-vlm module that `mlx_vlm.load` picks for it, given seeded random weights, and saved as a
real checkpoint: config.json, model.safetensors, the tiny test tokenizer with the family's media
tokens added, a ChatML template showing images with the family's marker, and the processor's
own files (preprocessor_config.json...), so `mlx_vlm.load` loads it offline and its processor
expands images as it would a real model's. The end-of-sequence token's rows of the output head
and the embedding are zero, so greedy decoding over random weights never ends early (a logit
of 0 is below the best of 1024 random ones). The five are made in about 2.5 CPU-seconds, and
cached by their parameters as the text zoo is (exod.models._io.build_atomically).

`reference` is what in-process mlx-vlm generates for a prompt and images, greedily: the tokens
exod's vision runner must reproduce.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path
from typing import Any, cast

import click

from exod.models._io import build_atomically, tokenizer_config, write_json
from tests.models.added_tokens import add_tokens
from tests.models.tiny import BOS, EOS, PAD
from tests.models.vision_families import FAMILIES, Family, chatml
from tests.models.zoo import copy_tokenizer, parse_sets

GENERATOR_VERSION = 2  # the models; `reference` may change freely
EOS_ID = 2  # the tiny tokenizer's <|im_end|>


def make_vision_model(out_dir: Path, family: str, *, seed: int = 0,
                      overrides: dict[str, Any] | None = None, force: bool = False) -> Path:
    """Make (or reuse) the tiny vision model of `family` at `out_dir`. `overrides` set values
    by path (benchmarks make bigger ones): "hidden_size", "vision_config/depth", and in the
    processor's files "@preprocessor_config.json/max_pixels"."""
    if family not in FAMILIES:
        raise ValueError(f"no tiny vision config for family {family!r}")
    spec = with_overrides(FAMILIES[family], overrides or {})
    params = {"generator": "tests.models.vision_zoo", "version": GENERATOR_VERSION,
              "family": family, "seed": seed, "config": spec.config, "tokens": spec.tokens,
              "marker": spec.marker, "files": spec.files, "tokenizer": spec.tokenizer_extra}
    # Each family its own weights, even where two share a text model (LLaVA's and SmolVLM's).
    family_seed = seed + zlib.crc32(family.encode())
    return build_atomically(Path(out_dir), params, lambda d: _build(spec, family_seed, d),
                            force=force)


def with_overrides(spec: Family, overrides: dict[str, Any]) -> Family:
    config, files = json.loads(json.dumps(spec.config)), json.loads(json.dumps(spec.files))
    for path, value in overrides.items():
        keys = path.split("/")
        target = files if keys[0].startswith("@") else config
        if keys[0].startswith("@"):
            keys[0] = keys[0][1:]
        for key in keys[:-1]:
            if not isinstance(target.get(key), dict):
                raise ValueError(f"override {path!r}: no {key!r} to set it in")
            target = target[key]
        target[keys[-1]] = value
    return dataclasses.replace(spec, config=config, files=files)


def _build(spec: Family, seed: int, out: Path) -> None:
    copy_tokenizer(out)
    ids = dict(zip(spec.tokens, add_tokens(out / "tokenizer.json", spec.tokens, sorted,
                                                  special=True),
                   strict=True))
    write_json(out / "tokenizer_config.json", {
        **tokenizer_config(bos=BOS, eos=EOS, pad=PAD, unk=None,
                           chat_template=chatml(spec.marker), max_length=4096),
        **_resolve(spec.tokenizer_extra, ids)})
    config = _resolve(spec.config, ids)
    config.update({"bos_token_id": 1, "eos_token_id": EOS_ID})
    write_json(out / "config.json", config)
    for name, content in spec.files.items():
        write_json(out / name, _resolve(content, ids))
    _write_weights(config, seed, out)


def _resolve(value: Any, ids: dict[str, int]) -> Any:
    """`value` with every "<tok:TEXT>" replaced by the id of the added token TEXT."""
    if isinstance(value, dict):
        return {k: _resolve(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, ids) for v in value]
    if isinstance(value, str) and value.startswith("<tok:") and value.endswith(">"):
        return ids[value[5:-1]]
    return value


def build_model(config: dict[str, Any]) -> Any:
    """The family's mlx-vlm Model for `config` (random weights, from the current mlx seed), as
    exod's runner builds one (exod.runner.vision.load.build)."""
    from exod.runner.vision.load import build

    return build(config)


def _write_weights(config: dict[str, Any], seed: int, out: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    mx.random.seed(seed)
    model = build_model(config)
    weights = dict(tree_flatten(model.parameters()))
    for name, w in weights.items():
        # Both ends: some families tie the head to the embedding whatever the config says.
        if name.endswith(("lm_head.weight", "embed_tokens.weight")) and w.shape[0] > EOS_ID:
            weights[name] = w.at[EOS_ID].multiply(0.0)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})


def picture(width: int = 64, height: int = 48, seed: int = 0) -> Any:
    """A small deterministic RGB picture (a PIL image): seeded noise over a seeded colour, so
    two seeds differ everywhere, as two photographs do."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, 3)
    noise = rng.integers(-64, 64, (height, width, 3))
    rgb = np.clip(base + noise, 0, 255)
    return Image.fromarray(rgb.astype(np.uint8), "RGB")


def reference(model_dir: Path, prompt: str, images: list[Any], max_tokens: int
              ) -> dict[str, Any]:
    """What in-process mlx-vlm generates, greedily, in float32 (as exod's runner computes on
    CPU), for a user's message of `images` (PIL images) then `prompt`, as content parts (the
    images where they are put, not where the family's default would put them: `content`):
    {"tokens", "prompt_tokens", "text": the tokens decoded}. With the BLAS the runner loads
    (exod.runner.cpu.blas): another one sums in another order, and a tiny random model's
    greedy pick can follow the last bits."""
    from exod.runner.cpu import blas

    blas.preload()  # before mlx: a no-op once mlx is in
    import mlx.core as mx
    from mlx_vlm import apply_chat_template, load
    from mlx_vlm.generate import stream_generate

    model, processor = cast("tuple[Any, Any]", load(str(model_dir)))
    model.set_dtype(mx.float32)
    _tokenizer_kwargs_stay_out(processor)
    text: Any = apply_chat_template(processor, model.config,
                                    [{"role": "user", "content": content(prompt, len(images))}],
                                    num_images=len(images))
    *_, last = stream_generate(model, processor, text, image=images or None,
                               max_tokens=max_tokens, temperature=0.0)
    tokens = list(last.token_ids or [])
    return {"tokens": tokens, "prompt_tokens": last.prompt_tokens,
            "text": processor.tokenizer.decode(tokens)}


def content(prompt: str, images: int) -> list[dict[str, Any]]:
    """A user's content of `images` image parts then `prompt`, in mlx-vlm's (and the OpenAI
    API's) shape; exod's wire has the images by index instead: {"type": "image", "image": i}."""
    return [*([{"type": "image"}] * images), {"type": "text", "text": prompt}]


# What mlx-vlm's generate passes every processor for its tokenizer (mlx_vlm.utils.process_inputs).
TOKENIZER_KWARGS = ("padding", "padding_side", "add_special_tokens", "return_tensors")


def _tokenizer_kwargs_stay_out(processor: Any) -> None:
    """mlx-vlm 0.7.10's LLaVA processor hands its tokenizer's arguments (padding...) on to the
    image processor, which transformers 5 refuses (`ImagesKwargs ... unexpected keyword
    argument 'padding'`; mlx-vlm#870, fixed there for PaliGemma only): a real LLaVA 1.5 fails
    the same way. The image processor is wrapped to drop them; exod's runner never passes them."""
    inner: Any = getattr(processor, "image_processor", None)
    if inner is None or type(processor).__name__ != "LlavaProcessor":
        return

    class Dropping:
        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return inner(*args, **{k: v for k, v in kwargs.items()
                                   if k not in TOKENIZER_KWARGS})

    processor.image_processor = Dropping()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("root", type=click.Path(file_okay=False, path_type=Path))
@click.argument("families", nargs=-1)
@click.option("--prompt", default=None, help="Also generate greedily from this prompt.")
@click.option("--images", default=1, show_default=True, help="test images shown with it")
@click.option("--image-seed", default=0, show_default=True, help="the first image's seed")
@click.option("--max-tokens", default=8, show_default=True)
@click.option("--set", "sets", multiple=True, metavar="PATH=JSON",
              help="Override a value (bigger models), e.g. --set vision_config/depth=8.")
def main(root: Path, families: tuple[str, ...], prompt: str | None, images: int,
         image_seed: int, max_tokens: int, sets: tuple[str, ...]) -> None:
    """Make the tiny vision models of FAMILIES (default: all) under ROOT; print one JSON object:
    family -> {"path", and with --prompt "tokens" (mlx-vlm's, greedy) and "prompt_tokens"}, the
    images being
    picture(seed=image_seed + i) for i < images}."""
    from exod.runner.cpu import blas

    blas.preload()  # before mlx (the models are made with it): as the runner computes
    overrides = parse_sets(sets)
    out: dict[str, dict[str, Any]] = {}
    for family in families or tuple(FAMILIES):
        try:
            path = make_vision_model(root / family, family, overrides=overrides)
        except ValueError as e:
            raise click.UsageError(str(e)) from e
        out[family] = {"path": str(path)}
        if prompt is not None:
            pics = [picture(seed=image_seed + i) for i in range(images)]
            out[family].update(reference(path, prompt, pics, max_tokens))
    click.echo(json.dumps(out))


if __name__ == "__main__":
    main()
