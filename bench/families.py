"""Families: which mlx-lm text families exod serves, in which layouts, with mlx-lm's tokens.

Every family of the zoo (tests.models.zoo: tiny models built from mlx-lm's own classes) and
its 4-bit variants is served by real daemons in 1 rank, a 2-rank pipeline and 2-rank tensor
parallelism; each answer is compared with in-process mlx-lm's greedy output. Prints the
supported-models table of docs/models.md (markdown): ✅ identical tokens; otherwise the config
check's refusal or what went wrong (after one more try alone: both answers go to stderr).
`--write` replaces the table in docs/models.md.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from bench import results
from bench.results import Figure
from tests.models.zoo import FAMILIES, NOT_TINY, QUANTIZED
from tests.zoo import LAYOUTS, OK, make_zoo, refusals, serve_zoo

PAGE = Path(__file__).resolve().parent.parent / "docs" / "models.md"
BEGIN, END = "<!-- families:begin -->", "<!-- families:end -->"
HEADS = {"one": "1 rank", "pp": "2-rank pipeline", "tp": "2-rank tensor"}


def table(only: list[str]) -> str:
    specs = only or list(FAMILIES) + [f"{f}:4" for f in QUANTIZED]
    with tempfile.TemporaryDirectory(prefix="exod-zoo-") as root:
        zoo = make_zoo(Path(root), specs)
        refused = refusals(zoo)
        served = serve_zoo(zoo, skip=set(refused))
        # Once more, alone, for what went wrong: a group that hangs while five agents share
        # two cores should not stand in the table for the family. Both answers are printed.
        again = {k for k, v in served.items() if v != OK}
        for (name, layout), got in sorted(serve_zoo(
                {n: zoo[n] for n, _ in again}, skip=set(refused) | (
                    {(n, lay) for n in zoo for lay in LAYOUTS} - again)).items()):
            print(f"retried {name} {layout}: first {served[name, layout]!r}, then {got!r}",
                  file=sys.stderr)
            served[name, layout] = got
    lines = ["| family (mlx-lm model_type) | " + " | ".join(HEADS.values()) + " |",
             "| --- | " + " | ".join("---" for _ in HEADS) + " |"]
    figures = []
    for name in zoo:
        cells = []
        for layout in LAYOUTS:
            if (name, layout) in refused:
                cells.append(f"refused by `exod check`: {refused[name, layout]}")
                figures.append(Figure(f"{name}, {HEADS[layout]}", None, text=cells[-1]))
            else:
                got = served[name, layout]
                cells.append("✅" if got == OK else f"❌ {got}")
                figures.append(Figure(f"{name}, {HEADS[layout]}", None, met=got == OK,
                                      text="mlx-lm's tokens" if got == OK else str(got)))
        lines.append(f"| {name} | " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    results.add(*figures, section="served in each layout, with mlx-lm's tokens")
    return "\n".join(lines + ["", footer()])


def footer() -> str:
    """The mlx-lm model modules that are not in the zoo, with the reason where known."""
    import importlib.util

    spec = importlib.util.find_spec("mlx_lm")
    models = Path(spec.origin).parent / "models" if spec and spec.origin else None
    modules = sorted(p.stem for p in models.glob("*.py")
                     if "class Model(" in p.read_text(encoding="utf-8")) if models else []
    untried = [m for m in modules if m not in FAMILIES and m not in NOT_TINY]
    text = "Not in the zoo: " + "; ".join(f"{k} ({v})" for k, v in sorted(NOT_TINY.items()))
    if untried:
        text += (". Not tried yet (each needs a tiny config of its own in "
                 "tests/models/zoo_families.py): " + ", ".join(untried))
    return text + "."


def main() -> None:
    """`--write` replaces the table in docs/models.md; `--only=SPEC,...` (zoo specs: FAMILY or
    FAMILY:BITS) serves only those and replaces their rows, keeping the others."""
    only = [x for a in sys.argv if a.startswith("--only=") for x in a[7:].split(",") if x]
    text = table(only)
    print(text)
    if "--write" not in sys.argv:
        return
    page = PAGE.read_text(encoding="utf-8")
    if only:
        rows = {row.split(" | ")[0]: row for row in text.splitlines()[2:] if row.startswith("| ")}
        head, _, rest = page.partition(BEGIN)
        block, _, tail = rest.partition(END)
        block = "\n".join(rows.get(line.split(" | ")[0], line) for line in block.split("\n"))
        PAGE.write_text(f"{head}{BEGIN}{block}{END}{tail}", encoding="utf-8")
        return
    block = f"{BEGIN}\n{text}\n{END}"
    new, n = re.subn(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, page,
                     flags=re.S)
    if n != 1:
        raise SystemExit(f"{PAGE} has no {BEGIN} ... {END} block")
    PAGE.write_text(new, encoding="utf-8")


if __name__ == "__main__":
    main()
