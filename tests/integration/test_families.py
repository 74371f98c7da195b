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

import json
import os
import shutil
from pathlib import Path

import openai
import pytest

from exod.models.zoo import FAMILIES, KNOWN_REFUSALS, QUANTIZED
from tests.harness import Daemon
from tests.zoo import OK, make_zoo, refusals, serve_zoo, spec_name

COVERING = ["llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "gemma3", "gemma3_text",
            "gpt_oss", "lfm2", "smollm3", "cohere2", "mixtral", "qwen3_5", "phi3", "exaone",
            "iquestloopcoder"]


def specs() -> list[str]:
    families = list(FAMILIES) if os.environ.get("EXOD_ZOO") == "all" else COVERING
    return families + [f"{f}:4" for f in QUANTIZED] + ["llama:8"]


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
