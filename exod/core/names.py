"""The names a request may give a model: an instance's own, or one of its `aliases`, each with or
without a tag (`:latest`).

Ollama's names are `[NAMESPACE/]MODEL[:TAG]` and a name without a tag means `:latest`; its
clients send either form, and some (Raycast) append `:latest` themselves. exod compares names in
that form, so `tiny`, `tiny:latest` name one instance, and an alias `qwen3:8b` answers to exactly
that tag. Pure: the config refuses a clash, the daemon looks names up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

LATEST = "latest"
# An alias as Ollama's clients write names: hf.co/ORG/NAME:Q4_K_M, library/llama3.2, qwen3:8b.
ALIAS_RE = r"(?a)^[A-Za-z0-9][\w./-]{0,199}(:\w[\w.-]{0,127})?\Z"  # (?a): \w is ASCII


def tagged(name: str) -> str:
    """`name` with its tag: `:latest` added when it has none (a colon before the last `/` is a
    host's port, not a tag)."""
    return name if ":" in name.rpartition("/")[2] else f"{name}:{LATEST}"


def table(aliases: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """Tagged name → instance, from each instance's name and aliases (the config has refused
    clashes; were one left, the instance's own name would win over another's alias)."""
    out: dict[str, str] = {}
    for name, more in aliases.items():
        for alias in more:
            out.setdefault(tagged(alias), name)
    for name in aliases:
        out[tagged(name)] = name
    return out


def clashes(aliases: Mapping[str, Iterable[str]]) -> list[tuple[str, str, str]]:
    """(instance, alias, the instance that already answers to it) for each alias that names
    another instance, another's alias, or one of its own names twice."""
    owner = {tagged(name): name for name in aliases}
    out = []
    for name, more in aliases.items():
        for alias in more:
            key = tagged(alias)
            if key in owner:
                out.append((name, alias, owner[key]))
            else:
                owner[key] = name
    return out


class Names:
    """What each name a request may give stands for (see `table`)."""

    def __init__(self, aliases: Mapping[str, Iterable[str]]) -> None:
        self._table = table(aliases)

    def instance(self, name: str) -> str | None:
        """The instance `name` names, if any."""
        return self._table.get(tagged(name))
