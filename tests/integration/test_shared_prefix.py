"""Shared prefixes prefilled once, through a daemon, in every layout the batch engine serves
(1 rank, a 2-rank pipeline, a 2-rank tensor group: every rank decides the same from the same
admissions and steps, exod.runner.serving.shared_prefix). Agents with the same long system
prompt arrive while another with it is still answering: each starts from a copy of its cache
(the status counts it), answers what in-process mlx-lm answers alone, and the one they followed
leaving fails none of them. Real runners, the official openai client. In process, the tokens
of every zoo family, the prefill counts, a leader cancelled while its followers still wait:
test_shared_prefix_engine.py."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.harness import Daemon
from tests.integration.test_group_serving import EOS, MLX_LM

SYSTEM = " ".join(f"Rule {i}: answer briefly and stay on topic." for i in range(60))
QUESTIONS = ["Name a colour.", "Count to three.", "Say hi."]
GREEDY: dict[str, Any] = {"max_tokens": 24, "temperature": 0, "logit_bias": {str(EOS): -100}}


def mlx_lm_greedy(model: Path, questions: list[str]) -> list[str]:
    import json
    import os
    import subprocess
    import sys

    script = MLX_LM.replace('[{"role": "user", "content": q}]',
                            f'[{{"role": "system", "content": {SYSTEM!r}}}, '
                            '{"role": "user", "content": q}]')
    out = subprocess.run([sys.executable, "-c", script, str(model), json.dumps(questions)],
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    texts: list[str] = json.loads(out.strip().splitlines()[-1])
    return texts


@pytest.fixture(scope="module")
def solo(tiny_model_factory: Callable[..., Path]) -> tuple[Path, list[str]]:
    """The model, and in-process mlx-lm's answer to each question alone: the same for every
    layout, so made once (and the module's tests run on one worker)."""
    model = tiny_model_factory(layers=6)
    return model, mlx_lm_greedy(model, QUESTIONS)


@pytest.mark.parametrize("layout", ["one", "pipeline", "tensor"])
def test_agents_that_arrive_together_prefill_their_system_prompt_once(
        daemons: Callable[..., Daemon], solo: tuple[Path, list[str]], layout: str) -> None:
    model, alone = solo
    split = {} if layout == "one" else {"shards": 2, "parallelism": layout}
    d = daemons({"instances": {"g": {"model": str(model), "max_concurrency": 8, **split}}})
    d.start()
    d.until_instance("g", lambda i: i["state"] == "ready" and i["serving"] is not None,
                     what="the instance ready, with its engine's figures")
    c = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0, timeout=120)

    def ask(q: str, **kw: Any) -> Any:
        return c.chat.completions.create(
            model="g", messages=[{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": q}], **{**GREEDY, **kw})

    # The first agent is answering (a long answer, under way) when the others arrive.
    lead = ask("Tell a long story.", max_tokens=100_000, stream=True)
    next(iter(lead))
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        running = [pool.submit(ask, q) for q in QUESTIONS]
        # Each starts from the first one's cache in flight (the prompt cache has none yet).
        d.until_instance("g", lambda i: i["serving"]["prompt_cache"]["shared_hits"] == 3,
                         what="the three prompts started from the first one's cache")
        lead.close()  # the one they followed leaves: none of them fails
        answers = [f.result() for f in running]
    texts = [a.choices[0].message.content for a in answers]
    assert texts == alone
    cache = d.instance("g")["serving"]["prompt_cache"]
    assert cache["lookups"] == 4 and cache["hits"] == 0 and cache["shared_hits"] == 3, cache
    assert cache["shared_tokens"] >= 3 * 500, cache
    assert all(a.usage.prompt_tokens_details.cached_tokens >= 500 for a in answers), answers
    assert d.instance("g")["restarts"] == 0
