"""The checks of exod.runner.cpu.split (run by test_split.py in a pytest of their own, so that the
suite's process never imports mlx): an activation cut into a slice per core gives every bit of
the whole one; only large inputs are cut, only into as many slices as the thread's pass may use;
the encoder cuts a pass that runs alone and keeps whole the passes that run side by side; and a
whole embedding model's vectors, cut, are bitwise its vectors uncut, for the encoder families
whose activations are modules (BERT, ModernBERT). Vectors against in-process mlx-vlm through
the daemon: tests/integration/test_embeddings.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exod.runner.cpu.blas import preload

preload()
import mlx.core as mx  # noqa: E402 -- after OpenBLAS, as in the runner
import mlx.nn as nn  # noqa: E402

from exod.config.embed import encoding  # noqa: E402
from exod.runner.cpu import split  # noqa: E402
from exod.runner.embed.encoder import Encoder  # noqa: E402
from exod.runner.embed.load import load_encoder  # noqa: E402
from tests.models.embed_zoo import make_embed_model  # noqa: E402

BIG = (64, 1024)  # 65,536 elements: above split.MIN_ELEMENTS


class Spy(nn.Module):
    """An activation that records the shapes it is called with."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, ...]] = []

    def __call__(self, x: mx.array) -> mx.array:
        self.calls.append(tuple(x.shape))
        return nn.gelu(x)


@pytest.mark.parametrize("act", [nn.GELU(), nn.GELU(approx="precise"), nn.GELU(approx="fast"),
                                 nn.SiLU(), nn.Sigmoid(), nn.Tanh(), nn.Mish(), nn.Softplus()],
                         ids=lambda a: type(a).__name__ + getattr(a, "_approx", ""))
@pytest.mark.parametrize("shape", [(1, *BIG), (3, 37, 1100), (5, 8192)], ids=str)
def test_a_cut_activation_is_bitwise_the_whole_one(act: nn.Module,
                                                   shape: tuple[int, ...]) -> None:
    splitter = split.Splitter(2)
    cut = split.SplitRows(act, splitter)
    x = mx.random.normal(shape, key=mx.random.key(len(shape))) * 4
    with splitter.cores(2):
        got = cut(x)
    want = act(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert mx.array_equal(got, want).item()


def test_only_large_inputs_are_cut_and_into_the_cores_allowed() -> None:
    splitter = split.Splitter(3)
    spy = Spy()
    cut = split.SplitRows(spy, splitter)
    big, small = mx.zeros((1, *BIG)), mx.zeros((1, 16, 1024))
    mx.eval(cut(big))  # a thread that set nothing: one core
    assert spy.calls == [(1, *BIG)]
    with splitter.cores(2):
        mx.eval(cut(big), cut(small))
    assert spy.calls[1:] == [(1, 32, 1024), (1, 32, 1024), (1, 16, 1024)]
    with splitter.cores(8):  # no more slices than streams
        mx.eval(cut(big))
    assert spy.calls[4:] == [(1, 21, 1024), (1, 21, 1024), (1, 22, 1024)]
    assert splitter.allowed() == 1  # the setting ends with its block


def test_every_activation_module_is_wrapped_once() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act = nn.GELU()
            self.proj = nn.Linear(4, 4)
            self.acts = [nn.SiLU(), nn.ReLU()]  # ReLU: cheap, left as it is

    model = Block()
    model.blocks = [Block(), Block()]
    splitter = split.Splitter(2)
    assert split.split_activations(model, splitter) == 6
    assert split.split_activations(model, splitter) == 0  # wrapped ones stay as they are
    assert isinstance(model.blocks[1].act, split.SplitRows)
    assert isinstance(model.acts[0], split.SplitRows) and isinstance(model.acts[1], nn.ReLU)
    assert len(model.parameters()["proj"]) == 2  # the tree's parameters are unchanged


def _encoder(tmp: Path, family: str) -> Encoder:
    path = make_embed_model(tmp / family, family, overrides={"intermediate_size": 1024})
    enc = encoding(path)
    assert enc is not None
    loaded = load_encoder(path, enc, dtype="float32", progress=lambda *_: None,
                          should_stop=lambda: False)
    return Encoder(loaded.model, enc, 0, threads=2)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_an_encoder_pass_alone_is_cut_and_bitwise_the_same(tmp_path: Path, family: str) -> None:
    encoder = _encoder(tmp_path, family)
    assert encoder.splitter is not None and encoder.split >= 2
    ids = [[5 + (i * 7) % 400 for i in range(48)], [9 + i % 50 for i in range(40)]]
    whole = [encoder.run([s], None, [None]) for s in ids]  # this thread set nothing: whole
    cut = [encoder.run_all([([s], None, [None])])[0] for s in ids]
    assert cut == whole  # bytes of float32 vectors: every bit


def test_passes_side_by_side_keep_their_activations_whole(tmp_path: Path) -> None:
    encoder = _encoder(tmp_path, "bert")
    seen: list[tuple[int, ...]] = []
    wrapped = [mod for _, mod in encoder.model.named_modules()
               if isinstance(mod, split.SplitRows)]
    for mod in wrapped:
        inner = mod.inner

        def record(x: mx.array, inner: Any = inner) -> mx.array:
            seen.append(tuple(x.shape))
            return inner(x)

        mod.inner = record
    ids = [5 + i % 300 for i in range(48)]
    encoder.run_all([([ids], None, [None]), ([ids], None, [None])])
    assert seen and all(s[-2] == 48 for s in seen)  # two passes at once: none cut
    seen.clear()
    encoder.run_all([([ids], None, [None])])
    assert seen and all(s[-2] == 24 for s in seen)  # one pass alone: cut in two
