"""Test models for every tool-call format real models write: a tiny model (tests.models.tiny)
whose tokenizer carries a family's real chat template, as published (tests.models.templates,
tests.models.families), and the family's control tokens, each one token.

- `steered=False`: the tiny model's random weights, for leak tests over many seeds.
- `steered=True`: one hand-set layer (tests.models.format_weights) that, with nothing in the
  request steering it, writes what a real model of the family writes, as its template renders
  it (tests.models.format_chains): given the trigger text and an agent's tool (Claude Code's
  Bash, Codex's exec_command, the agent libraries' echo) and no tool result yet, a short
  reasoning in the family's syntax where it has one, then a whole call of that tool, then the
  family's end of a call; given a tool result, reasoning then AFTER; else (reasoning then)
  PLAIN. In every template mode (thinking on or off). Markers are single tokens, the text
  between them added tokens, so a streamed call crosses token boundaries.

The steered model checks itself before it is published: every kind of prompt, rendered by the
template and tokenized, run through the network in numpy, must give its chain with every
winning logit at least 50 ahead.

CLI: ``python -m tests.models.formats TINY_DIR OUT_ROOT [FAMILY...] [--random] [--templates
DIR]`` makes OUT_ROOT/FAMILY (steered) or OUT_ROOT/FAMILY-random and prints a JSON object
family -> folder as the last line of stdout. Needs numpy, tokenizers and transformers; no mlx.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from exod.models._io import build_atomically, log
from tests.models.agent import TRIGGER
from tests.models.families import FAMILIES, Family
from tests.models.format_chains import AGENTS, Scenario, output, render, scenarios, tool_name
from tests.models.format_rules import (
    MAX_BACK,
    Gate,
    Position,
    RuleConflict,
    check,
    compile_rules,
    defaults,
    positions,
)
from tests.models.format_vocab import (
    add_tokens,
    as_vocab_key,
    family_tokens,
    split_pieces,
    write_tokenizer,
)
from tests.models.format_weights import CONTEXT, Layout, config, forward, weights
from tests.models.templates import default_cache, read_template, templates_dir

# Bump when the output for the same inputs changes, so cached folders get rebuilt.
GENERATOR_VERSION = 2  # 2: opencode's bash tool
MIN_LEAD = 50.0  # the self-check: how far each written token's logit must lead


def make_format_model(tiny: Path, family: str, out: Path, *, steered: bool,
                      templates: Path | None = None) -> Path:
    """Make (or reuse) `family`'s format model at `out` from the tiny model at `tiny`; returns
    `out`. `templates`: llama.cpp's templates folder (default: fetched into the test cache)."""
    fam = FAMILIES[family]
    folder = templates or templates_dir(default_cache())
    template = read_template(folder, fam.template)
    params = {"generator": "tests.models.formats", "version": GENERATOR_VERSION,
              "family": family, "steered": steered, "tiny": str(Path(tiny).resolve()),
              "template": fam.template, "template_chars": len(template)}

    def build(staging: Path) -> None:
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json",
                     "model.safetensors"):
            shutil.copyfile(Path(tiny) / name, staging / name)
        if steered:
            _steer(staging, fam, template)
        else:
            write_tokenizer(staging, fam, template)

    return build_atomically(Path(out), params, build)


@dataclass
class _Answer:
    """One scenario, tokenized: the prompt, its fixed tail, and what the model writes."""

    scenario: Scenario
    prompt: list[int]
    tail: tuple[int, ...]
    chain: tuple[int, ...]
    text: str


def _markers(fam: Family) -> dict[str, str]:
    marks = {"T": TRIGGER, "R": fam.result_marker}
    marks.update({f"M:{a}": fam.tool_marker.format(tool_name(a)) for a in AGENTS})
    if fam.think_marker:
        marks["TH"] = fam.think_marker
    return marks


def _steer(folder: Path, fam: Family, template: str) -> None:
    from transformers import AutoTokenizer

    pristine = (folder / "tokenizer.json").read_text(encoding="utf-8")
    write_tokenizer(folder, fam, template)
    renderer = AutoTokenizer.from_pretrained(folder)
    cases = scenarios(fam)
    again = scenarios(fam, again=True)
    texts = [output(renderer, fam, s) for s in cases]
    prompts = [(render(renderer, s, answered=False), render(renderer, a, answered=False))
               for s, a in zip(cases, again, strict=True)]
    marks = _markers(fam)
    pieces = [split_pieces(t, fam.tokens, marks.values()) for t in texts]
    extra = _added(json.loads(pristine), fam, [*marks.values(), *(p for ps in pieces
                                                                   for p in ps)])
    (folder / "tokenizer.json").write_text(pristine, encoding="utf-8")
    ids = write_tokenizer(folder, fam, template, extra)

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False).ids)

    def piece_ids(piece: str) -> list[int]:
        if piece in ids:
            return [ids[piece]]
        key = as_vocab_key(piece)
        return [vocab[key]] if key in vocab else encode(piece)

    answers = []
    for case, text, ps, (prompt, prompt_again) in zip(cases, texts, pieces, prompts,
                                                       strict=True):
        chain = tuple(i for p in ps for i in piece_ids(p))
        if tok.decode(list(chain), skip_special_tokens=False) != text:
            raise ValueError(f"{fam.name} {case.kind}: the chain does not spell {text!r}")
        a, b = encode(prompt), encode(prompt_again)
        fixed = next((n for n in range(min(len(a), len(b), MAX_BACK + 1), 0, -1)
                      if a[-n:] == b[-n:]), 0)
        if fixed == 0:
            raise ValueError(f"{fam.name} {case.kind}: the prompt ends with what the user wrote")
        answers.append(_Answer(case, a, tuple(a[-fixed:]), chain, text))

    markers = {kind: [ids[m] if m in ids else vocab[as_vocab_key(m)]]
               for kind, m in marks.items()}
    all_positions: list[Position] = []
    for ans in answers:
        gates = _gates(fam, ans, markers)
        if gates[0].kind != ans.scenario.kind:
            raise ValueError(f"{fam.name}: a {ans.scenario.kind} prompt reads as {gates[0]} "
                             f"(markers {marks})")
        all_positions += positions(gates, ans.tail, ans.chain)
    try:
        rules = compile_rules(all_positions)
        check(rules, all_positions)
    except RuleConflict as e:
        named = {str(i): repr(tok.id_to_token(i)) for i in range(len(vocab))}
        raise RuleConflict(f"{fam.name}: " + " ".join(
            named.get(w.strip("(),"), w) for w in str(e).split(" "))) from None
    layout = Layout(len(vocab), markers, tuple(AGENTS), rules, defaults(all_positions))
    tensors = weights(layout)
    for ans in answers:
        _self_check(fam, tensors, ans)

    from safetensors.numpy import save_file

    model_config = json.loads((folder / "config.json").read_text())
    model_config.update(config(layout))
    (folder / "config.json").write_text(json.dumps(model_config, indent=2))
    (folder / "model.safetensors").unlink()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "mlx"})
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    tok_config["model_max_length"] = CONTEXT  # agents' prompts run to tens of thousands
    (folder / "tokenizer_config.json").write_text(
        json.dumps(tok_config, indent=2, ensure_ascii=False), encoding="utf-8")


def _added(tokenizer: dict[str, Any], fam: Family, texts: Sequence[str]) -> list[str]:
    """The texts a steered model's vocabulary must add: markers and pieces that are neither
    the family's tokens, nor whitespace (the tokenizer's own), nor one token of the vocabulary
    still, once the added tokens have taken their merges."""
    own = set(fam.tokens)
    wanted = [t for t in dict.fromkeys(texts) if t not in own and t.strip()]
    extra = [t for t in wanted if as_vocab_key(t) not in tokenizer["model"]["vocab"]]
    while True:
        trial = json.loads(json.dumps(tokenizer))
        add_tokens(trial, family_tokens(fam, extra))
        lost = [t for t in wanted
                if t not in extra and as_vocab_key(t) not in trial["model"]["vocab"]]
        if not lost:
            return extra
        extra += lost


def _gates(fam: Family, ans: _Answer, markers: dict[str, list[int]]) -> list[Gate]:
    """The gate in force as the model writes each token of its chain: from the markers in the
    prompt and in what it has written so far."""
    seen = set(ans.prompt)
    out = []
    for token in ans.chain:
        has = {kind: any(t in seen for t in ts) for kind, ts in markers.items()}
        think = has.get("TH") if fam.think_marker else None
        if has["R"]:
            kind = "after"
        elif has["T"] and any(has[f"M:{a}"] for a in AGENTS):
            kind = "call:" + next(a for a in AGENTS if has[f"M:{a}"])
        else:
            kind = "plain"
        out.append(Gate(kind, think))
        seen.add(token)
    return out


def _self_check(fam: Family, tensors: dict[str, Any], ans: _Answer) -> None:
    """Teacher-forced through the numpy network: at the prompt's end and after each written
    token, the next token of the chain wins by MIN_LEAD or more."""
    import numpy as np

    tokens = ans.prompt + list(ans.chain[:-1])
    logits = forward(tensors, tokens, queries=len(ans.chain))
    for i, want in enumerate(ans.chain):
        row = logits[i]
        lead = row[want] - np.max(np.delete(row, want))
        if lead < MIN_LEAD:
            raise ValueError(f"{fam.name} {ans.scenario.kind} {ans.scenario.mode}: token {i} "
                             f"({want}) leads by {lead:.1f}, top {int(np.argmax(row))}")


def make_format_models(tiny: Path, root: Path, families: Sequence[str], *, steered: bool,
                       templates: Path | None = None) -> dict[str, Path]:
    """Every family of `families` under `root` (FAMILY, or FAMILY-random)."""
    made = {}
    for name in families:
        t0 = time.monotonic()
        out = Path(root) / (name if steered else f"{name}-random")
        made[name] = make_format_model(tiny, name, out, steered=steered, templates=templates)
        log(f"{name}: {'steered' if steered else 'random'} in {time.monotonic() - t0:.1f}s")
    return made


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("tiny", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.argument("root", type=click.Path(file_okay=False, path_type=Path))
@click.argument("families", nargs=-1)
@click.option("--random", "random_", is_flag=True, help="The random-weight variants.")
@click.option("--templates", type=click.Path(file_okay=False, exists=True, path_type=Path),
              default=None, help="llama.cpp's templates [default: fetched into the test cache].")
def main(tiny: Path, root: Path, families: tuple[str, ...], random_: bool,
         templates: Path | None) -> None:
    """Make format models under ROOT and print a JSON object family -> folder."""
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise click.UsageError(f"unknown families {unknown}; known: {sorted(FAMILIES)}")
    made = make_format_models(tiny, root, families or tuple(FAMILIES), steered=not random_,
                              templates=templates)
    click.echo(json.dumps({k: str(v) for k, v in made.items()}))


if __name__ == "__main__":
    sys.exit(main())
