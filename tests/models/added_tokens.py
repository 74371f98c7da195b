"""A copy of a tiny model whose tokenizer has tokens added in place of its last merges: the
added tokens take those merges' ids, so the vocabulary keeps its size and every id still has a
row in the embedding (tests.models.thinking's markers, tests.models.caller's whole calls).
Plain file work: no mlx."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Order = Callable[[list[int]], list[int]]


def copy_with_tokens(src: Path, out: Path, texts: Sequence[str],
                     order: Order = lambda ids: ids,
                     edit: Callable[[Path], None] = lambda folder: None) -> list[int]:
    """Copy `src` to `out` (replaced if there, whole or not at all) with `texts` added as
    tokens, the n-th given the n-th id of `order` applied to the last merges' ids (last merge
    first); `edit` may change the copy's other files before it is in place. The ids, in the
    order of `texts`."""
    src, out = Path(src), Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns(".exod-*"))
    ids = add_tokens(tmp / "tokenizer.json", texts, order)
    edit(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return ids


def add_tokens(path: Path, texts: Sequence[str], order: Order = lambda ids: ids,
               special: bool = False) -> list[int]:
    """Add `texts` to the tokenizer.json at `path`, in place, as copy_with_tokens does; their
    ids in the order of `texts`. The tokenizers library gives the added tokens the listed ids
    sorted, in the listed order: with an `order` that sorts, the ids returned are the ones the
    tokenizer uses."""
    tok: dict[str, Any] = json.loads(path.read_text())
    model = tok["model"]
    freed = [model["vocab"].pop(first + second)
             for first, second in (model["merges"].pop() for _ in texts)]
    ids = order(freed)
    for i, text in zip(ids, texts, strict=True):
        tok["added_tokens"].append({
            "id": i, "content": text, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": special})
    path.write_text(json.dumps(tok, ensure_ascii=False))
    return ids
