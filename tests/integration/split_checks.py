"""The checks of exod.runner.cpu.split (run by test_split.py in a pytest of their own, so that the
suite's process never imports mlx): an activation cut into a slice per core gives every bit of
the whole one; only large inputs are cut, only into as many slices as the thread's pass may use;
the encoder cuts a pass that runs alone and keeps whole the passes that run side by side; a
gated MLP's class is swapped only where its activation is found bitwise (a family's own
function, quantized too), and never where its projections are not plain (a group's sharded
ones) nor in a pipeline rank's stand-in blocks (whose weights stay unread); and whole models
give bitwise the same numbers cut as uncut: embedding models (BERT, ModernBERT: activation
modules; Qwen3-Embedding: gated), text families of the zoo (prefill
logits) and every family of the vision zoo (tower and language model: tokens and logprobs of
mlx-vlm's own generate). Attention's heads: cut only where mlx's own function gives every bit
in the self-test's forms, never in a decode step. The zoo's models are tiny, so `MIN_ELEMENTS`
and `MIN_SCORES` are lowered to 0 where a whole model runs: every activation of two rows or
more, and every attention call of two queries or more, is cut."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exod.runner.cpu.blas import preload

preload()
import mlx.core as mx  # noqa: E402 -- after OpenBLAS, as in the runner
import mlx.nn as nn  # noqa: E402

import mlx_lm  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from exod.facts.embed import encoding  # noqa: E402
from exod.runner.cpu import attention, split  # noqa: E402
from exod.runner.cpu.streams import ActivationSplitter  # noqa: E402
from exod.runner.embed.encoder import Encoder  # noqa: E402
from exod.runner.embed.load import load_encoder  # noqa: E402
from tests.models.embed_zoo import make_embed_model  # noqa: E402
from tests.models.vision_zoo import FAMILIES as VISION_FAMILIES  # noqa: E402
from tests.models.vision_zoo import (  # noqa: E402
    _tokenizer_kwargs_stay_out,
    make_vision_model,
    picture,
)
from tests.models.zoo import make_family_model  # noqa: E402

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
    splitter = ActivationSplitter(2)
    cut = split.SplitRows(act, splitter)
    x = mx.random.normal(shape, key=mx.random.key(len(shape))) * 4
    with splitter.cores(2):
        got = cut(x)
    want = act(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert mx.array_equal(got, want).item()


def test_only_large_inputs_are_cut_and_into_the_cores_allowed() -> None:
    splitter = ActivationSplitter(3)
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
    splitter = ActivationSplitter(2)
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


@pytest.fixture
def cut_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every activation of two rows or more, and every attention call of two queries or more,
    is cut (the zoo's models are tiny)."""
    monkeypatch.setattr(split, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(attention, "MIN_SCORES", 0)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_an_encoder_pass_alone_is_cut_and_bitwise_the_same(tmp_path: Path, family: str) -> None:
    encoder = _encoder(tmp_path, family)
    assert encoder.split is not None and encoder.split.activations >= 2
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


@pytest.mark.usefixtures("cut_all")
def test_a_decoder_embedding_model_is_cut_in_its_gated_mlps(tmp_path: Path) -> None:
    path = make_embed_model(tmp_path / "qwen3", "qwen3")
    enc = encoding(path)
    assert enc is not None
    loaded = load_encoder(path, enc, dtype="float32", progress=lambda *_: None,
                          should_stop=lambda: False)
    ids = [[5 + (i * 7) % 400 for i in range(40)]]
    encoder = Encoder(loaded.model, enc, 0, threads=1)  # nothing cut
    whole = encoder.run(ids, None, [None])
    done = split.install(loaded.model, 2)
    assert done is not None and done.gated.modules == 2 and not done.gated.kept, done
    with done.splitter.cores(2):
        assert encoder.run(ids, None, [None]) == whole


# The families most run, each found by its own activation (gemma's GeGLU: gelu_approx); phi3's
# MLP fuses gate and up in one projection and GPT-2's has none: they are not gated MLPs.
TEXT = {"llama": 2, "qwen2": 2, "qwen3": 2, "mistral": 2, "gemma3_text": 2, "phi3": 0, "gpt2": 0}


@pytest.mark.usefixtures("cut_all")
@pytest.mark.parametrize("family,bits", [*((f, None) for f in TEXT), ("llama", 4)], ids=str)
def test_a_text_family_prefills_bitwise_the_same_cut(tmp_path: Path, family: str,
                                                     bits: int | None) -> None:
    path = make_family_model(tmp_path / family, family, bits=bits)
    model, _ = mlx_lm.load(str(path))
    if bits is None:
        model.set_dtype(mx.float32)
    ids = mx.array([[3 + (i * 11) % 1000 for i in range(40)]])
    want = model(ids)
    mx.eval(want)
    done = split.install(model, 2)
    assert done is not None
    assert done.gated.modules >= TEXT[family], done  # the tiny zoo's models have 2 layers
    assert not done.gated.kept, done.gated.kept
    with done.splitter.cores(2):
        got = model(ids)
    assert mx.array_equal(got, want).item()
    assert split.install(model, 2).gated.modules == 0  # nothing is swapped twice


def test_a_groups_sharded_projections_are_left_as_they_are() -> None:
    class Sharded(nn.Linear):  # as mlx-lm's sharded linears: its call talks to the group
        pass

    class MLP(nn.Module):
        def __init__(self, linear: type[nn.Linear]) -> None:
            super().__init__()
            self.gate_proj, self.up_proj = linear(8, 16), linear(8, 16)
            self.down_proj = linear(16, 8)

        def __call__(self, x: mx.array) -> mx.array:
            return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))

    plain, sharded = MLP(nn.Linear), MLP(Sharded)
    splitter = ActivationSplitter(2)
    assert split.split_gated(sharded, splitter).modules == 0
    assert type(sharded) is MLP
    done = split.split_gated(plain, splitter)
    assert done.modules == 1 and list(done.swapped) == ["MLP"]
    assert done.swapped["MLP"] in ("swiglu", "silu")  # the same bits: the first wins
    assert type(plain) is not MLP and isinstance(plain, MLP)
    assert sorted(k for k, _ in tree_flatten(plain.parameters())) == sorted(
        k for k, _ in tree_flatten(sharded.parameters()))  # the tree is the same


def test_a_pipeline_ranks_stand_ins_stay_unread(tmp_path: Path) -> None:
    """Finding a gated MLP's activation tries the MLP on an input: never a stand-in's (the
    first MLP visited is the last block's, another rank's on rank 0), whose weights it would
    read from disk and keep."""
    from exod.core.shards import Shard
    from exod.runner.text.load import load_shard
    from tests.models.tiny import make_tiny_model

    path = make_tiny_model(tmp_path / "tiny", layers=4, hidden=128, intermediate=512)
    loaded = load_shard(path, Shard(0, 2, 0, 2, 4), progress=lambda done, total: None,
                        should_stop=lambda: False)
    held = mx.get_active_memory()
    done = split.install(loaded.model, 2)
    assert done is not None
    assert done.gated.modules == 2, done  # the rank's own blocks'
    assert mx.get_active_memory() == held  # no stand-in's MLP (768 KiB each) was read


def test_an_activation_no_candidate_gives_is_kept_with_its_reason() -> None:
    class Squared(nn.Module):  # ReLU²: no candidate computes it
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(8, 16), nn.Linear(8, 16)
            self.down_proj = nn.Linear(16, 8)

        def __call__(self, x: mx.array) -> mx.array:
            return self.down_proj(mx.square(nn.relu(self.gate_proj(x))) * self.up_proj(x))

    mlp = Squared()
    done = split.split_gated(mlp, ActivationSplitter(2))
    assert done.modules == 0 and type(mlp) is Squared
    assert done.kept == {"Squared": "no known activation gives its every bit"}


@pytest.mark.usefixtures("cut_all")
@pytest.mark.parametrize("family", sorted(VISION_FAMILIES))
def test_a_vision_family_generates_bitwise_the_same_cut(tmp_path: Path, family: str) -> None:
    from mlx_vlm import apply_chat_template, load
    from mlx_vlm.generate import stream_generate

    path = make_vision_model(tmp_path / family, family)
    model, processor = load(str(path))
    model.set_dtype(mx.float32)
    _tokenizer_kwargs_stay_out(processor)  # as the zoo's reference does
    prompt = apply_chat_template(processor, model.config, [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "What is in the picture?"}]}], num_images=1)
    image = picture(96, 80, seed=3)

    def answer() -> tuple[list[int], list[mx.array]]:
        steps = list(stream_generate(model, processor, prompt, image=[image], max_tokens=6,
                                     temperature=0.0))
        return [s.token for s in steps], [s.logprobs for s in steps]

    want_tokens, want_lp = answer()
    done = split.install(model, 2)
    assert done is not None and done.activations + done.gated.modules > 0, done
    with done.splitter.cores(2):
        tokens, lp = answer()
    assert tokens == want_tokens
    assert all(mx.array_equal(a, b).item() for a, b in zip(lp, want_lp, strict=True))


class AttentionSpy:
    """mlx's attention, recording the heads and queries of each call."""

    def __init__(self, stock: Any) -> None:
        self.stock, self.calls = stock, []

    def __call__(self, q: mx.array, k: mx.array, v: mx.array, **kw: Any) -> mx.array:
        self.calls.append((q.shape[1], q.shape[2]))
        return self.stock(q, k, v, **kw)


@pytest.fixture
def fresh_attention() -> Any:
    """mlx's own attention, and no cut installed, for the test; as it was after."""
    attention.uninstall()
    stock = mx.fast.scaled_dot_product_attention
    yield stock
    attention.uninstall()
    mx.fast.scaled_dot_product_attention = stock


def test_attention_heads_are_cut_in_prefill_and_never_in_a_decode_step(
        fresh_attention: Any) -> None:
    spy = AttentionSpy(fresh_attention)
    mx.fast.scaled_dot_product_attention = spy
    splitter = ActivationSplitter(2)
    assert attention.install(splitter) == ""
    cut = mx.fast.scaled_dot_product_attention
    assert cut is not spy
    q, k = mx.random.normal((1, 9, 256, 32)), mx.random.normal((1, 3, 256, 32))
    spy.calls.clear()
    with splitter.cores(2):
        got = cut(q, k, k, scale=0.2, mask="causal")
        mx.eval(got, cut(q[:, :, -1:], k, k, scale=0.2))  # a decode step: one query
    assert spy.calls == [(4, 256), (5, 256), (9, 1)]  # a slice may end inside a group
    assert mx.array_equal(got, fresh_attention(q, k, k, scale=0.2, mask="causal")).item()
    spy.calls.clear()
    mx.eval(cut(q, k, k, scale=0.2, mask="causal"))  # a thread that set nothing: whole
    assert spy.calls == [(9, 256)]


def test_attention_stays_mlxs_own_where_the_self_test_finds_a_difference(
        fresh_attention: Any) -> None:
    def off_by_heads(q: mx.array, k: mx.array, v: mx.array, **kw: Any) -> mx.array:
        return fresh_attention(q, k, v, **kw) + q.shape[1]  # differs once the heads are cut

    mx.fast.scaled_dot_product_attention = off_by_heads
    why = attention.install(ActivationSplitter(2))
    assert why == "the self-test's plain call differs from mlx's own", why
    assert mx.fast.scaled_dot_product_attention is off_by_heads
