"""Positions and problems: what every config error carries (file, line, column, key path)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Mark:
    """A place in a file, 1-based. line 0 means "the file as a whole" (e.g. it cannot be read)."""

    file: str
    line: int = 0
    col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}" if self.line else self.file


@dataclass(frozen=True)
class Problem:
    file: str
    line: int  # 1-based; 0 when the problem concerns the whole file
    col: int
    key_path: str  # e.g. "instances.big.stop.grace"; "" at the top of a file
    message: str

    @classmethod
    def at(cls, mark: Mark, key_path: str, message: str) -> Problem:
        return cls(mark.file, mark.line, mark.col, key_path, message)

    def __str__(self) -> str:
        where = str(Mark(self.file, self.line, self.col))
        return f"{where}: {self.key_path}: {self.message}" if self.key_path else (
            f"{where}: {self.message}"
        )


class ConfigError(Exception):
    """The configuration is invalid. Holds every problem found, not just the first."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)
