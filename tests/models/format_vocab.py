"""A format model's tokenizer files: the tiny model's byte-level BPE (tests.models.tiny) with a
family's tokens added in place of its last merges, so the vocabulary keeps its size (as
tests.models.added_tokens does), each added token special or not as the family says, and the
family's template, bos, eos and pad in tokenizer_config.json.

Plain JSON work: no mlx, no tokenizers, no transformers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from tests.models.families import Family


@lru_cache(maxsize=1)
def _byte_chars() -> dict[int, str]:
    """GPT-2's bytes-to-characters table, as byte-level BPE writes its vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def as_vocab_key(text: str) -> str:
    """`text` as a byte-level BPE vocabulary spells it ("a b" -> "aĠb")."""
    table = _byte_chars()
    return "".join(table[b] for b in text.encode("utf-8"))


def add_tokens(tokenizer: dict[str, Any], tokens: Mapping[str, bool]) -> dict[str, int]:
    """Add `tokens` (text -> special) to a tokenizer.json's content, in place: each takes the id
    of one of the last merges (the rarest pieces), in ascending order as the texts come, since
    transformers pairs added tokens with ids in the file's order. Texts the tokenizer already
    has as added tokens keep theirs. Returns every given text's id."""
    model = tokenizer["model"]
    added = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    new = [text for text in tokens if text not in added]
    freed = sorted(model["vocab"].pop("".join(model["merges"].pop())) for _ in new)
    for i, text in zip(freed, new, strict=True):
        tokenizer["added_tokens"].append({
            "id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": tokens[text]})
        added[text] = i
    tokenizer["added_tokens"].sort(key=lambda t: t["id"])
    return {text: added[text] for text in tokens}


def family_tokens(family: Family, extra: Iterable[str] = ()) -> dict[str, bool]:
    """The family's own tokens (special or not, as its table says), then `extra` (not
    special): what a format model's vocabulary adds."""
    tokens = {t: True for t in family.special}
    tokens.update({t: False for t in family.plain})
    for text in extra:
        tokens.setdefault(text, False)
    return tokens


def tokenizer_config(family: Family, template: str, max_length: int) -> dict[str, Any]:
    """tokenizer_config.json: the fast tokenizer class, the family's template and tokens."""
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": family.bos,
        "eos_token": family.eos,
        "pad_token": family.pad or family.eos,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "chat_template": template,
        **family.tokenizer_extra,
    }
    return config


def write_tokenizer(folder: Path, family: Family, template: str,
                    extra: Iterable[str] = ()) -> dict[str, int]:
    """Rewrite `folder`'s tokenizer (a copy of the tiny model's) for `family`, with `extra`
    tokens added too; config.json and generation_config.json get the family's bos, eos and pad
    ids. Returns the id of every added text."""
    path = folder / "tokenizer.json"
    tokenizer = json.loads(path.read_text(encoding="utf-8"))
    ids = add_tokens(tokenizer, family_tokens(family, extra))
    path.write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    config = json.loads((folder / "config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        tokenizer_config(family, template, int(config["max_position_embeddings"])),
        indent=2, ensure_ascii=False), encoding="utf-8")
    special = {"bos_token_id": ids.get(family.bos) if family.bos else None,
               "eos_token_id": [ids[t] for t in family.eos_ids],
               "pad_token_id": ids[family.pad or family.eos]}
    config.update(special)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(special, indent=2))
    return ids


def split_pieces(text: str, tokens: Iterable[str], markers: Iterable[str]) -> list[str]:
    """`text` cut into what a format model writes as one token each: the family's tokens and
    the detection markers as themselves, every run of newlines alone, and the text between
    them as one piece (a piece never holds a marker, so a prompt holding the same text still
    shows the marker as its token)."""
    pieces = [text]
    for cutters in (sorted(tokens, key=len, reverse=True),
                    sorted(markers, key=len, reverse=True)):
        for cutter in cutters:
            pieces = [part for piece in pieces
                      for part in ([piece] if piece in tokens or piece in markers
                                   else _cut(piece, cutter))]
    out: list[str] = []
    for piece in pieces:
        if piece in tokens or piece in markers:
            out.append(piece)
            continue
        out.extend(p for p in _newline_runs(piece) if p)
    return out


def _cut(text: str, cutter: str) -> list[str]:
    parts = text.split(cutter)
    out: list[str] = []
    for i, part in enumerate(parts):
        if i:
            out.append(cutter)
        if part:
            out.append(part)
    return out


def _newline_runs(text: str) -> list[str]:
    out, current = [], ""
    for ch in text:
        if (ch == "\n") != current.startswith("\n") and current:
            out.append(current)
            current = ""
        current += ch
    return [*out, current]
