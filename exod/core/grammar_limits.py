"""The grammar engine's bounds as they travel from an instance's config (`grammar:`) to its
runners: one command-line argument, `SIZE:STATES:FUEL:STEP_FUEL`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineLimits:
    max_size: int = 200_000
    max_lexer_states: int = 50_000
    compile_fuel: int = 1_000_000
    step_fuel: int = 200_000

    def arg(self) -> str:
        return f"{self.max_size}:{self.max_lexer_states}:{self.compile_fuel}:{self.step_fuel}"

    @classmethod
    def parse(cls, text: str) -> EngineLimits:
        """Raises ValueError for anything but four positive integers."""
        parts = [int(p) for p in text.split(":")]
        if len(parts) != 4 or min(parts) < 1:
            raise ValueError(f"grammar limits {text!r}: four positive integers expected")
        return cls(*parts)
