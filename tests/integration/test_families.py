"""The zoo: tiny models built from mlx-lm's own classes at test time (tests.models.zoo), one per
text family mlx-lm ships, plus 4-bit and 8-bit variants, served by real daemons with the same
greedy text as in-process mlx-lm.

Every family is asked of the probe in a 2-rank pipeline and a 2-rank tensor layout (one
subprocess for all: seconds), and the refusals must be exactly the known ones
(zoo.KNOWN_REFUSALS), so a change in either direction shows here. Then every family is served
in both split layouts the check accepts (2-rank pipeline and 2-rank tensor), several families
to a daemon (CHUNK families each). On 1 rank are served llama (first and alone, see `zoo`),
the families a split refuses and the quantized variants: for the others the split layouts
already run everything 1 rank does (the family's own forward, batched by the same engine on
rank 0, the same loader) and more. `python -m bench families` serves every family in all
three layouts for the table in docs/models.md.
About 500 runners in all: each costs ~0.8 CPU-seconds, most of it importing mlx-lm (~1.9 before
exod.runner.start.import_table). The zoo is made once per run; its chunks run on any xdist worker.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import openai
import pytest

from tests.models.zoo import FAMILIES, KNOWN_REFUSALS, NOT_SERVED, QUANTIZED
from tests.harness import Daemon
from tests.shared import made_once
from tests.zoo import LAYOUTS, OK, make_zoo, refusals, serve_zoo, spec_name

SPECS = list(FAMILIES) + [f"{f}:4" for f in QUANTIZED] + ["llama:8"]
# Families per daemon: 8 x (1 + 2 + 2) = 40 runners at most (a chunk per worker). Each daemon
# and its zygote cost ~2 CPU-s however many runners they start (~0.1 each, forked).
CHUNK = 8
CHUNKS = -(-len(SPECS) // CHUNK)
Zoo = dict[str, dict[str, str]]


# Session-scoped, not module: the zoo is made once per run (made_once) and its chunks are spread
# over every pytest-xdist worker, which a module-scoped fixture would keep on one.
@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    made: Zoo = made_once(tmp_path_factory, "zoo", make)  # once per run: ~80 s of CPU
    return made


def make(root: Path) -> Zoo:
    made = make_zoo(root, SPECS)
    assert sorted(made) == sorted(spec_name(s) for s in SPECS)
    # llama alone first, on 1 rank: its runner builds the decode step's kernels (mlx's JIT,
    # kept in $TMPDIR/mlx) that nearly every family uses. Without it, the 30 runners of the
    # first daemon all find them missing at once and each builds them with the C++ compiler:
    # minutes of CPU on a clean machine, for the same few files.
    assert serve_zoo({"llama": made["llama"]}, skip=set(), layouts=("one",)) == \
        {("llama", "one"): OK}
    return made


@pytest.fixture(scope="session")
def refused(zoo: Zoo, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], str]:
    listed = made_once(tmp_path_factory, "zoo-refusals",
                       lambda _: [[*k, v] for k, v in refusals(zoo).items()])
    return {(name, layout): reason for name, layout, reason in listed}


def test_the_check_refuses_exactly_the_known_layouts(refused: dict[tuple[str, str], str]
                                                      ) -> None:
    assert sorted(refused) == sorted(KNOWN_REFUSALS), refused


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_family_in_every_layout(zoo: Zoo, refused: dict[tuple[str, str], str],
                                      chunk: int) -> None:
    names = sorted(zoo)[chunk * CHUNK:(chunk + 1) * CHUNK]
    assert names, "more chunks than families: lower CHUNKS"
    chosen = {n: zoo[n] for n in names}
    ones = one_rank(refused)
    skip = set(refused) | {(n, "one") for n in chosen if n not in ones}
    served = serve_zoo(chosen, skip=skip, per_daemon=CHUNK, layouts=tuple(LAYOUTS))
    wrong = {k: v for k, v in served.items() if v != OK}
    assert sorted(n for n, _ in wrong) == sorted(n for n in NOT_SERVED if n in chosen), wrong
    assert sorted(served) == sorted((n, lay) for n in chosen for lay in LAYOUTS
                                    if (n, lay) not in skip)


def one_rank(refused: dict[tuple[str, str], str]) -> set[str]:
    """The families served on 1 rank as well: those a split refuses, and quantized variants."""
    return {n for n, _ in refused} | {spec_name(s) for s in SPECS if ":" in s}


def test_one_rank_covers_what_the_splits_do_not(refused: dict[tuple[str, str], str]) -> None:
    ones = one_rank(refused)
    assert {"afm7", "llama4", "rwkv7", "llama-q8"} <= ones, ones  # refused, refused, quantized
    assert "llama" not in ones and "qwen2" not in ones  # both split layouts serve them


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
