"""How the probe words a layout's failure (exod.runner.split.wording): real mlx errors, raised from
code that sits where mlx-lm's model code does, become a reason a user understands, where in the
family's code it failed, and the raw error as a detail."""

from __future__ import annotations

from exod.runner.split.wording import explain

MODEL_CODE = "/venv/site-packages/mlx_lm/models/fam.py"


def raised(source: str) -> BaseException:
    """The exception `source` raises, run as if it were mlx-lm's model code."""
    namespace: dict[str, object] = {}
    try:
        exec(compile(source, MODEL_CODE, "exec"), namespace)  # noqa: S102 -- our own source
    except Exception as e:  # noqa: BLE001 -- it is what we want
        return e
    raise AssertionError("did not raise")


def test_a_reshape_to_the_full_width_is_explained_with_where_and_the_raw_error() -> None:
    e = raised("import mlx.core as mx\n"
               "class Attention:\n"
               "    def __call__(self):\n"
               "        return mx.zeros((96,)).reshape(1, 3, 64)\n"
               "Attention()()\n")
    why = explain(e, "tensor")
    assert why.reason == ("the model's code reshapes a split projection to a width only the "
                          "whole model has (at mlx_lm/models/fam.py:4, in __call__)")
    assert why.detail == "ValueError: [reshape] Cannot reshape array of size 96 into shape " \
                         "(1,3,64)."


def test_split_and_whole_parts_that_meet_are_explained() -> None:
    e = raised("import mlx.core as mx\n"
               "def gate():\n"
               "    return mx.zeros((1, 2)) + mx.zeros((0,))\n"
               "gate()\n")
    why = explain(e, "tensor")
    assert why.reason.startswith("the model's code combines a split part with one that is not "
                                 "split (at mlx_lm/models/fam.py:3, in gate)"), why
    assert why.detail is not None and "[broadcast_shapes]" in why.detail


def test_a_refusal_by_the_familys_own_shard_keeps_its_words() -> None:
    e = raised("def shard():\n"
               "    assert False, 'group size 3 must divide vocab_size 1024'\n"
               "shard()\n")
    why = explain(e, "tensor")
    assert why.reason == ("mlx-lm's own sharding of this family refuses it: group size 3 must "
                          "divide vocab_size 1024 (at mlx_lm/models/fam.py:2, in shard)")
    assert why.detail is None


def test_anything_else_says_which_split_failed_and_keeps_the_raw_error() -> None:
    e = raised("def forward():\n    raise TypeError('unexpected keyword cache')\nforward()\n")
    why = explain(e, "pipeline")
    assert why.reason == ("the model's forward fails once divided into layer ranges "
                          "(at mlx_lm/models/fam.py:2, in forward)")
    assert why.detail == "TypeError: unexpected keyword cache"


def test_no_list_of_layers_and_the_probes_own_refusals_are_already_words() -> None:
    from exod.runner.split.blocks import NoBlocks
    from exod.runner.split.tensor import CannotShard

    why = explain(NoBlocks("mlx_lm.models.fam has no list of layers"), "pipeline")
    assert why.reason == "the model has no list of layers to divide among ranks"
    assert why.detail == "mlx_lm.models.fam has no list of layers"
    words = "its 3 key/value heads do not split across 2 ranks (Attention.n_kv_heads = 3)"
    assert explain(CannotShard(words), "tensor").reason == words
