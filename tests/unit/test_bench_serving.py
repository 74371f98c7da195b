"""The arithmetic of `bench serving` (pure): sides take turns ABBA, each figure is the median of
per-round ratios with their range, and the verdict looks the right way for rates and times."""

from __future__ import annotations

from typing import Any

from bench.serving import Result, one_client, order, paired, row


def test_two_rounds_make_an_abba() -> None:
    sides: list[Any] = ["exod", "mlx"]
    assert [s for r in range(4) for s in order(r, sides)] == ["exod", "mlx", "mlx", "exod"] * 2


def test_a_figure_is_the_median_of_the_per_round_ratios() -> None:
    # One round disturbed on one side only (the machine was busy): the median keeps to the
    # other rounds, the range shows it.
    exod = [10.0, 12.0, 3.0, 11.0]
    mlx = [10.0, 10.0, 10.0, 10.0]
    med, lo, hi = paired(exod, mlx)
    assert (med, lo, hi) == (1.05, 0.3, 1.2)


def test_the_verdict_looks_the_right_way() -> None:
    assert row("tok/s", [12.0], [10.0], "tok/s", 1.0, True).line().endswith("OK")
    assert row("tok/s", [8.0], [10.0], "tok/s", 1.0, True).line().endswith("MISSED")
    assert row("ttft", [0.8], [1.0], "ms", 1e3, False).line().endswith("OK")
    assert row("ttft", [1.2], [1.0], "ms", 1e3, False).line().endswith("MISSED")


class FakeSide:
    def __init__(self, name: str, calls: list[str], tokens: int) -> None:
        self.name, self.calls, self.tokens = name, calls, tokens

    def chat(self, messages: list[Any]) -> tuple[Result, str]:
        self.calls.append(self.name)
        return Result(0.0, self.tokens), "text"


def test_one_client_takes_turns_request_by_request() -> None:
    calls: list[str] = []
    sides: list[Any] = [FakeSide("exod", calls, 32), FakeSide("mlx", calls, 0)]
    rates = one_client(sides, 3, 0)
    assert calls == ["exod", "mlx", "mlx", "exod", "exod", "mlx"]
    assert rates["exod"] > 0 and rates["mlx"] == 0
    calls.clear()
    one_client(sides, 2, 1)  # the next round starts with the other side
    assert calls == ["mlx", "exod", "exod", "mlx"]
