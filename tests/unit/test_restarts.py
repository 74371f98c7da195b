"""RestartTracker: backoff growth, cap and jitter, stable-run reset, start limit, modes."""

from __future__ import annotations

import random

import pytest

from exod.config.schema import BackoffPolicy, RestartMode, StartLimit
from exod.core.exits import ExitInfo
from exod.core.restarts import GiveUp, Rest, Restart, RestartTracker

CLEAN, UNCLEAN, KILLED = ExitInfo(code=0), ExitInfo(code=1), ExitInfo(signal=9)


def tracker(mode: RestartMode = "on-failure", *, initial: float = 1.0, multiplier: float = 2.0,
            max: float = 60.0, jitter: float = 0.0, reset_after: float = 60.0, burst: int = 100,
            interval: float = 60.0, seed: int = 0) -> RestartTracker:
    return RestartTracker(
        mode,
        BackoffPolicy(initial=initial, multiplier=multiplier, max=max, jitter=jitter,
                      reset_after=reset_after),
        StartLimit(burst=burst, interval=interval),
        rng=random.Random(seed),
    )


def delays(tr: RestartTracker, times: list[float], info: ExitInfo = UNCLEAN) -> list[float]:
    out = []
    for t in times:
        d = tr.on_exit(t, info)
        assert isinstance(d, Restart), d
        out.append(d.delay)
    return out


# ---- delay ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("initial", "multiplier", "cap", "expected"), [
    (1.0, 2.0, 60.0, [1, 2, 4, 8, 16, 32, 60, 60, 60]),
    (0.5, 3.0, 10.0, [0.5, 1.5, 4.5, 10, 10, 10, 10, 10, 10]),
    (2.0, 1.0, 60.0, [2] * 9),  # multiplier 1: constant
    (5.0, 2.0, 3.0, [3] * 9),  # initial above the cap: capped from the start
    (0.0, 2.0, 60.0, [0] * 9),
])
def test_delay_grows_exponentially_up_to_the_cap(initial: float, multiplier: float, cap: float,
                                                 expected: list[float]) -> None:
    tr = tracker(initial=initial, multiplier=multiplier, max=cap)
    assert [tr.delay(a) for a in range(9)] == [float(x) for x in expected]


@pytest.mark.parametrize("jitter", [0.1, 0.5, 1.0])
def test_jitter_stays_within_its_spread_and_under_the_cap(jitter: float) -> None:
    tr = tracker(initial=1.0, multiplier=2.0, max=20.0, jitter=jitter, seed=42)
    for attempt in range(8):
        base = min(20.0, 2.0 ** attempt)
        got = [tr.delay(attempt) for _ in range(200)]
        assert all(max(0.0, base * (1 - jitter)) <= d <= min(20.0, base * (1 + jitter))
                   for d in got), (attempt, min(got), max(got))
        if base < 20.0:  # really random, on both sides of the base
            assert len(set(got)) > 50  # (some may be clamped to the cap)
            assert min(got) < base < max(got)
        else:  # at the cap, jitter only shortens
            assert 20.0 in got and min(got) < 20.0


def test_jitter_is_reproducible_with_a_seeded_rng() -> None:
    a, b = tracker(jitter=0.3, seed=7), tracker(jitter=0.3, seed=7)
    assert [a.delay(i) for i in range(10)] == [b.delay(i) for i in range(10)]
    assert [a.delay(3) for _ in range(5)] != [tracker(jitter=0.3, seed=8).delay(3)
                                              for _ in range(5)]


def test_on_exit_delays_follow_the_attempts() -> None:
    tr = tracker(max=10.0)
    assert delays(tr, [float(t) for t in range(7)]) == [1, 2, 4, 8, 10, 10, 10]
    assert tr.restarts == 7


def test_a_long_slow_crash_loop_keeps_a_capped_delay() -> None:
    tr = tracker(max=60.0, burst=5, interval=60.0)  # the defaults
    got = delays(tr, [100.0 * i for i in range(1, 1201)])  # one crash every 100s: ~33 hours
    assert got[-1] == 60.0


# ---- stable run reset --------------------------------------------------------------------
def test_a_stable_run_resets_the_delay() -> None:
    tr = tracker(reset_after=30.0)
    assert delays(tr, [0.0, 1.0, 3.0]) == [1, 2, 4]
    tr.on_ready(10.0)
    assert delays(tr, [40.0]) == [1]  # ready for exactly reset_after
    assert delays(tr, [41.0]) == [2]


def test_a_short_run_does_not_reset_the_delay() -> None:
    tr = tracker(reset_after=30.0)
    assert delays(tr, [0.0, 1.0]) == [1, 2]
    tr.on_ready(10.0)
    assert delays(tr, [39.999]) == [4]
    # readiness is per run: the next run that never got ready does not inherit it
    assert delays(tr, [100.0]) == [8]


def test_a_stable_run_also_clears_the_start_limit_count() -> None:
    tr = tracker(burst=3, interval=1000.0, reset_after=5.0)
    delays(tr, [0.0, 1.0])
    tr.on_ready(2.0)
    assert delays(tr, [10.0, 11.0]) == [1, 2]  # 4 failures in the window, but 2 after a reset
    assert isinstance(tr.on_exit(12.0, UNCLEAN), GiveUp)


# ---- start limit ---------------------------------------------------------------------------
def test_start_limit_gives_up_on_the_burst_th_failure_in_the_window() -> None:
    tr = tracker(burst=3, interval=10.0)
    delays(tr, [0.0, 1.0])
    d = tr.on_exit(2.0, UNCLEAN)
    assert isinstance(d, GiveUp)
    assert "start limit" in d.reason and "exit code 1" in d.reason
    assert "3 failures in 10s" in d.reason
    assert tr.restarts == 2


def test_failures_outside_the_window_do_not_count() -> None:
    tr = tracker(burst=3, interval=10.0)
    # never 3 within 10s: never gives up, however long it goes on
    times = [0.0, 6.0, 12.5, 19.0, 25.5, 32.0, 38.5, 45.0]
    assert len(delays(tr, times)) == len(times)
    # then a burst
    assert isinstance(tr.on_exit(46.0, UNCLEAN), GiveUp)


@pytest.mark.parametrize("info", [UNCLEAN, KILLED], ids=str)
def test_burst_of_one_gives_up_at_the_first_failure(info: ExitInfo) -> None:
    d = tracker(burst=1).on_exit(0.0, info)
    assert isinstance(d, GiveUp) and "start limit" in d.reason


def test_reset_forgets_failures_and_attempts() -> None:
    tr = tracker(burst=3, interval=100.0)
    delays(tr, [0.0, 1.0])
    assert isinstance(tr.on_exit(2.0, UNCLEAN), GiveUp)
    tr.reset()
    assert delays(tr, [3.0, 4.0]) == [1, 2]
    assert isinstance(tr.on_exit(5.0, UNCLEAN), GiveUp)
    assert tr.restarts == 4  # the status counter is not an operator's business to reset


# ---- modes ---------------------------------------------------------------------------------
MODES = [
    ("no", CLEAN, Rest), ("no", UNCLEAN, GiveUp), ("no", KILLED, GiveUp),
    ("on-failure", CLEAN, Rest), ("on-failure", UNCLEAN, Restart), ("on-failure", KILLED, Restart),
    ("always", CLEAN, Restart), ("always", UNCLEAN, Restart), ("always", KILLED, Restart),
]


@pytest.mark.parametrize(("mode", "info", "kind"), MODES,
                         ids=[f"{m}-{i}" for m, i, _ in MODES])
def test_restart_modes(mode: RestartMode, info: ExitInfo, kind: type) -> None:
    tr = tracker(mode)
    d = tr.on_exit(0.0, info, "runner says hi")
    assert type(d) is kind
    if not isinstance(d, Restart):
        assert d.reason == f"{info}: runner says hi"
    assert tr.restarts == (1 if kind is Restart else 0)


@pytest.mark.parametrize("mode", ["no", "on-failure", "always"])
@pytest.mark.parametrize("code", [64, 65, 69, 78])
def test_permanent_exit_codes_give_up_at_once(mode: RestartMode, code: int) -> None:
    tr = tracker(mode)
    d = tr.on_exit(0.0, ExitInfo(code=code), "cannot load: bad shape")
    assert d == GiveUp(f"exit code {code}: cannot load: bad shape")
    assert tr.restarts == 0


@pytest.mark.parametrize("code", [1, 2, 75, 137, 255])
def test_other_exit_codes_are_retried(code: int) -> None:
    assert isinstance(tracker().on_exit(0.0, ExitInfo(code=code)), Restart)


def test_reason_without_runner_account_is_the_exit_itself() -> None:
    assert tracker("no").on_exit(0.0, KILLED) == GiveUp("signal 9 (SIGKILL)")


# ---- the backoff itself (restarts and downloads share it) -----------------------------------
def test_backoff_grows_and_settles_after_a_stable_run() -> None:
    from exod.core.restarts import Backoff

    b = Backoff(BackoffPolicy(initial=1.0, multiplier=2.0, max=60.0, jitter=0.0,
                              reset_after=30.0))
    assert [b.next() for _ in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert not b.settle(None, 100.0) and not b.settle(90.0, 119.0)  # never, or too short
    assert b.next() == 16.0
    assert b.settle(10.0, 40.0) and b.next() == 1.0  # reset_after exactly: stable
    b.reset()
    assert b.attempt == 0
