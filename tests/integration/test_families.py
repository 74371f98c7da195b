"""The zoo: tiny models built from mlx-lm's own classes at test time (exod.models.zoo), plus
4-bit variants, served by real daemons in 1 rank, a 2-rank pipeline and 2-rank tensor
parallelism, with the same greedy text as in-process mlx-lm. Layouts the probe refuses are
refused by the config check before any process starts, and must be exactly the known ones
(zoo.KNOWN_REFUSALS), so a change in either direction shows here.

The suite serves a set that covers each mechanism (PipelineMixin families, language_model
wrappers, sliding-window patterns, hybrid conv/attention, no-rope layers, dense vs MoE layers,
the families' own shard() and the generic sharding, quantized weights) to stay fast on two
cores; EXOD_ZOO=all serves every family, as `python -m bench families` does for the README.
"""

from __future__ import annotations

import os

import pytest

from exod.models.zoo import FAMILIES, KNOWN_REFUSALS, QUANTIZED
from tests.zoo import OK, make_zoo, refusals, serve_zoo, spec_name

COVERING = ["llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "gemma3", "gemma3_text",
            "gpt_oss", "lfm2", "smollm3", "cohere2", "mixtral", "qwen3_5", "phi3", "exaone"]


def specs() -> list[str]:
    families = list(FAMILIES) if os.environ.get("EXOD_ZOO") == "all" else COVERING
    return families + [f"{f}:4" for f in QUANTIZED]


def test_the_zoo_in_every_layout(tmp_path_factory: pytest.TempPathFactory) -> None:
    zoo = make_zoo(tmp_path_factory.mktemp("zoo"), specs())
    assert sorted(zoo) == sorted(spec_name(s) for s in specs())
    refused = refusals(zoo)
    known = {k: v for k, v in KNOWN_REFUSALS.items() if k[0] in zoo}
    assert refused.keys() == known.keys(), refused
    served = serve_zoo(zoo, skip=set(refused))
    wrong = {k: v for k, v in served.items() if v != OK}
    assert not wrong, wrong
    assert len(served) == 3 * len(zoo) - len(refused)
