"""The zoo: tiny models built from mlx-lm's own classes at test time (exod.models.zoo), one per
text family mlx-lm ships, plus 4-bit and 8-bit variants, served by real daemons with the same
greedy text as in-process mlx-lm.

What the suite covers, and why not more: every family is asked of the probe in a 2-rank
pipeline and 2-rank tensor layout (one subprocess for all: seconds), and the refusals must be
exactly the known ones (zoo.KNOWN_REFUSALS), so a change in either direction shows here. Every
family is served with 1 rank (many instances per daemon). The 2-rank layouts are served for a
covering set only: each mechanism a split can get wrong (PipelineMixin families, language_model
wrappers, sliding-window patterns, hybrid conv / linear-attention / state-space layers, no-rope
layers, dense vs MoE layers, low-rank attention, attention sinks, the families' own shard()
and the generic sharding, quantized weights). Serving every family in all three layouts costs
about five times the 1-rank run (two runners per 2-rank instance and a group to form) and
would take the suite past 20 minutes on two cores: EXOD_ZOO=all serves them all, as
`python -m bench families` does for the README's table.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import openai
import pytest

from exod.models.zoo import FAMILIES, KNOWN_REFUSALS, NOT_SERVED, QUANTIZED
from tests.harness import Daemon
from tests.zoo import OK, make_zoo, refusals, serve_zoo, spec_name

COVERING = ["llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "gemma3", "gemma3_text",
            "gpt_oss", "lfm2", "smollm3", "cohere2", "mixtral", "qwen3_5", "phi3", "exaone",
            "iquestloopcoder", "nemotron_h", "jamba", "mimo_v2_flash", "deepseek_v2", "qwen",
            "plamo", "qwen3_next", "granitemoehybrid"]
SPECS = list(FAMILIES) + [f"{f}:4" for f in QUANTIZED] + ["llama:8"]
Zoo = dict[str, dict[str, str]]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    made = make_zoo(tmp_path_factory.mktemp("zoo"), SPECS)
    assert sorted(made) == sorted(spec_name(s) for s in SPECS)
    return made


@pytest.fixture(scope="module")
def refused(zoo: Zoo) -> dict[tuple[str, str], str]:
    return refusals(zoo)


def test_the_check_refuses_exactly_the_known_layouts(refused: dict[tuple[str, str], str]
                                                      ) -> None:
    assert sorted(refused) == sorted(KNOWN_REFUSALS), refused


def test_every_family_on_one_rank(zoo: Zoo) -> None:
    served = serve_zoo(zoo, skip=set(), per_daemon=16, layouts=("one",))
    wrong = {k: v for k, v in served.items() if v != OK}
    assert sorted(n for n, _ in wrong) == sorted(NOT_SERVED), wrong
    assert len(served) == len(zoo)


def test_the_split_layouts(zoo: Zoo, refused: dict[tuple[str, str], str]) -> None:
    names = list(zoo) if os.environ.get("EXOD_ZOO") == "all" else \
        [spec_name(s) for s in COVERING] + [n for n in zoo if "-q" in n]
    chosen = {n: zoo[n] for n in names}
    served = serve_zoo(chosen, skip=set(refused), layouts=("pp", "tp"))
    wrong = {k: v for k, v in served.items() if v != OK}
    assert not wrong, wrong
    assert len(served) == 2 * len(chosen) - sum(1 for n, _ in refused if n in chosen)


def test_a_chat_template_in_chat_template_jinja_is_used(
        tmp_path: Path, tiny_model: Path) -> None:
    """Checkpoints now often keep the template in chat_template.jinja rather than in
    tokenizer_config.json: the prompt is built from it all the same."""
    jinja = tmp_path / "jinja-model"
    shutil.copytree(tiny_model, jinja, ignore=shutil.ignore_patterns(".exod-*"))
    config_file = jinja / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    (jinja / "chat_template.jinja").write_text(config.pop("chat_template"))
    config_file.write_text(json.dumps(config))
    d = Daemon({"ready": "instances", "instances": {"inline": {"model": str(tiny_model)},
                                                    "jinja": {"model": str(jinja)}}})
    try:
        d.start()
        c = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0)
        usage = {}
        for name in ("inline", "jinja"):
            r = c.chat.completions.create(model=name, max_tokens=1, messages=[
                {"role": "user", "content": "hello"}])
            assert r.usage is not None
            usage[name] = r.usage.prompt_tokens
    finally:
        d.close()
    # The fallback without a template ("user: hello\nassistant: ") would count differently.
    assert usage["jinja"] == usage["inline"], usage
