"""A model named by hub repository: `hf:ORG/NAME[@REVISION]`, or `{repo: ORG/NAME, revision: R}`.

The `hf:` prefix keeps a name apart from a relative path (`models/llama` is a directory). Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "hf:"
DEFAULT_REVISION = "main"
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
_REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class HubRef:
    repo: str  # ORG/NAME
    revision: str = DEFAULT_REVISION  # a branch, a tag or a commit

    def __str__(self) -> str:
        tail = "" if self.revision == DEFAULT_REVISION else f"@{self.revision}"
        return f"{PREFIX}{self.repo}{tail}"

    @property
    def folder(self) -> str:
        """The repository's folder in huggingface_hub's cache."""
        return "models--" + self.repo.replace("/", "--")

    @property
    def pinned(self) -> bool:
        """A commit names one snapshot for ever; a branch or a tag may move."""
        return bool(COMMIT_RE.fullmatch(self.revision))


def is_hub_name(text: str) -> bool:
    return text.startswith(PREFIX)


def repo_problem(repo: str) -> str | None:
    if ".." in repo or not _REPO_RE.fullmatch(repo):
        return (f"{repo!r} is not a hub repository name (expected ORG/NAME, letters, digits "
                "and . _ -)")
    return None


def revision_problem(revision: str) -> str | None:
    if ".." in revision or not _REVISION_RE.fullmatch(revision):
        return f"{revision!r} is not a revision (a branch, a tag or a commit)"
    return None


def parse(text: str) -> HubRef:
    """`hf:ORG/NAME[@REVISION]` (or without the prefix); ValueError with a one-line reason."""
    body = text[len(PREFIX):] if is_hub_name(text) else text
    repo, at, revision = body.partition("@")
    return make(repo, revision if at else DEFAULT_REVISION)


def make(repo: str, revision: str = DEFAULT_REVISION) -> HubRef:
    problem = repo_problem(repo) or revision_problem(revision)
    if problem:
        raise ValueError(problem)
    return HubRef(repo, revision)
