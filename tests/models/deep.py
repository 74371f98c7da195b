"""A deeper copy of a real model, for benchmarks of speculative decoding: the original drafts,
the copy checks. No model hub is reachable here, so no trained pair of a large model and its
small draft (Qwen3-8B and Qwen3-0.6B) can be had; this makes one with the same shape of
costs and agreement.

The copy keeps every layer of the original and adds `extra` more after them, each a copy of an
original layer whose output projections (attention's o_proj, the MLP's down_proj) are scaled
by `scale`: each added layer nudges the hidden state a little, so the copy costs about
(layers + extra) / layers as much a token, and its greedy tokens are mostly, not always, the
original's (`scale` sets how often).

CLI: ``python -m tests.models.deep SRC OUT [--extra N] [--scale S]`` prints OUT last.
mlx is imported only when a model is built.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import cast

import click

from exod.models._io import build_atomically, log

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.*)$")
_OUTPUTS = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def make_deep_model(src: Path, out: Path, extra: int, scale: float) -> Path:
    params = {"src": str(src.resolve()), "extra": extra, "scale": scale, "version": 1}

    def build(tmp: Path) -> None:
        import mlx.core as mx

        config = json.loads((src / "config.json").read_text())
        layers = int(config["num_hidden_layers"])
        weights: dict[str, mx.array] = {}
        for f in sorted(src.glob("model*.safetensors")):
            weights.update(cast("dict[str, mx.array]", mx.load(str(f))))
        by_layer: dict[int, dict[str, mx.array]] = {}
        for name, w in weights.items():
            m = _LAYER.match(name)
            if m:
                by_layer.setdefault(int(m[1]), {})[m[2]] = w
        for i in range(extra):
            for part, w in by_layer[i % layers].items():
                weights[f"model.layers.{layers + i}.{part}"] = w * scale if part in _OUTPUTS \
                    else w
        mx.save_safetensors(str(tmp / "model.safetensors"), weights)
        (tmp / "config.json").write_text(json.dumps(
            {**config, "num_hidden_layers": layers + extra}, indent=2))
        for f in src.iterdir():
            if f.name.startswith("tokenizer") or f.name.endswith(".jinja"):
                shutil.copy2(f, tmp / f.name)

    build_atomically(out, params, build)
    log(f"deep model ready in {out}")
    return out


@click.command()
@click.argument("src", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--extra", default=90, show_default=True, help="layers added")
@click.option("--scale", default=0.05, show_default=True, help="of the added layers' outputs")
def main(src: Path, out: Path, extra: int, scale: float) -> None:
    print(make_deep_model(src, out, extra, scale))


if __name__ == "__main__":
    main()
