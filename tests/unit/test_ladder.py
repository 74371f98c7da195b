"""The termination ladder: its shape as data, and the deadline-driven evaluator."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exod.config.schema import StopPolicy
from exod.core.ladder import LadderRun, Rung, Step, describe, rungs, worst_case

ASK, TERM, KILL = Step.ASK, Step.TERM, Step.KILL
P = StopPolicy(grace=10.0, drain=5.0, attempts=3, interval=5.0, kill_interval=1.0)


def policy(grace: float = 10.0, attempts: int = 3, interval: float = 5.0,
           kill_interval: float = 1.0) -> StopPolicy:
    return StopPolicy(grace=grace, attempts=attempts, interval=interval,
                      kill_interval=kill_interval)


def on_time(run: LadderRun, n: int) -> list[tuple[float, Step]]:
    """A punctual caller: tick exactly at each deadline, n times; returns (time, step)."""
    out = []
    for _ in range(n):
        t = run.deadline
        step = run.due(t)
        assert step is not None
        out.append((t, step))
    return out


# ---- shape -------------------------------------------------------------------------------
@pytest.mark.parametrize(("pol", "expected"), [
    (policy(attempts=0, grace=7), (Rung(ASK, 7), Rung(KILL, 1))),
    (policy(attempts=1, grace=0, interval=2), (Rung(ASK, 0), Rung(TERM, 2), Rung(KILL, 1))),
    (policy(attempts=3, kill_interval=0.5),
     (Rung(ASK, 10), Rung(TERM, 5), Rung(TERM, 5), Rung(TERM, 5), Rung(KILL, 0.5))),
], ids=["attempts0", "attempts1", "attempts3"])
def test_rungs_shape(pol: StopPolicy, expected: tuple[Rung, ...]) -> None:
    assert rungs(pol) == expected


@pytest.mark.parametrize(("pol", "expected"), [
    (policy(grace=10, attempts=3, interval=5), 25.0),
    (policy(grace=10, attempts=0, interval=5), 10.0),
    (policy(grace=0, attempts=1, interval=2), 2.0),
    (policy(grace=0, attempts=0), 0.0),
    (StopPolicy(), 25.0),  # the documented default
])
def test_worst_case(pol: StopPolicy, expected: float) -> None:
    assert worst_case(pol) == expected


def test_describe() -> None:
    assert describe(P) == "ask, wait 10s → SIGTERM ×3 every 5s → SIGKILL (worst case 25s)"
    assert describe(policy(grace=0.5, attempts=0)) == (
        "ask, wait 0.5s → SIGTERM ×0 every 5s → SIGKILL (worst case 0.5s)")


# ---- the run -----------------------------------------------------------------------------
def test_a_run_starts_by_asking() -> None:
    run = LadderRun(P, 100.0)
    assert run.first is ASK and run.current is ASK
    assert run.sent == [(100.0, ASK)]
    assert run.started == 100.0 and run.deadline == 110.0


@pytest.mark.parametrize(("pol", "expected"), [
    (P, [(110, TERM), (115, TERM), (120, TERM), (125, KILL), (126, KILL), (127, KILL)]),
    (policy(attempts=1, grace=0, interval=2, kill_interval=3),
     [(100, TERM), (102, KILL), (105, KILL), (108, KILL)]),
    (policy(attempts=0, grace=4, kill_interval=0.5), [(104, KILL), (104.5, KILL), (105, KILL)]),
], ids=["default-like", "no-grace", "no-sigterm"])
def test_step_sequence_at_exact_deadlines(pol: StopPolicy, expected: list[tuple[float, Step]]
                                          ) -> None:
    run = LadderRun(pol, 100.0)
    got = on_time(run, len(expected))
    assert got == [(float(t), s) for t, s in expected]
    assert run.sent == [(100.0, ASK), *got]
    assert run.current is KILL


def test_due_is_none_before_each_deadline_and_does_not_move_it() -> None:
    run = LadderRun(P, 100.0)
    for t, step in [(110.0, TERM), (115.0, TERM), (120.0, TERM), (125.0, KILL), (126.0, KILL)]:
        for early in (run.sent[-1][0], t - 1.0, t - 1e-6):
            assert run.due(early) is None
            assert run.deadline == t
        assert run.due(t) is step
        assert run.due(t) is None  # one step per deadline, even when asked twice at once
    assert len(run.sent) == 6


def test_kill_repeats_forever() -> None:
    run = LadderRun(policy(attempts=1, grace=1, interval=1, kill_interval=2), 0.0)
    steps = on_time(run, 50)
    assert [s for _, s in steps] == [TERM] + [KILL] * 49
    assert [t for t, _ in steps[1:]] == [2.0 + 2 * i for i in range(49)]


# ---- skip_grace --------------------------------------------------------------------------
def test_skip_grace_sends_sigterm_now_then_keeps_the_intervals() -> None:
    run = LadderRun(P, 100.0)
    run.skip_grace(103.0)
    assert run.deadline == 103.0
    assert run.due(103.0) is TERM
    assert run.due(103.0) is None  # never straight on to SIGKILL
    assert on_time(run, 4) == [(108.0, TERM), (113.0, TERM), (118.0, KILL), (119.0, KILL)]


def test_skip_grace_without_sigterm_rungs_goes_to_sigkill() -> None:
    run = LadderRun(policy(attempts=0, grace=30), 0.0)
    run.skip_grace(1.0)
    assert run.due(1.0) is KILL


def test_skip_grace_only_affects_rung_one() -> None:
    run = LadderRun(P, 100.0)
    assert run.due(110.0) is TERM
    run.skip_grace(111.0)
    assert run.deadline == 115.0
    assert run.due(111.0) is None
    run.due(115.0), run.due(120.0), run.due(125.0)
    assert run.current is KILL
    run.skip_grace(125.5)
    assert run.deadline == 126.0


def test_skip_grace_never_postpones() -> None:
    run = LadderRun(P, 100.0)
    run.skip_grace(105.0)
    run.skip_grace(108.0)  # a third stop signal, later: keeps the earlier deadline
    assert run.deadline == 105.0
    late = LadderRun(P, 100.0)
    late.skip_grace(130.0)  # after the grace ran out (tick not yet delivered)
    assert late.deadline == 110.0


# ---- late ticks ----------------------------------------------------------------------------
def test_a_late_tick_sends_one_step_and_skips_none() -> None:
    run = LadderRun(P, 0.0)
    assert run.due(60.0) is TERM  # 35s past the worst case: still SIGTERM first
    assert run.due(60.0) is TERM  # the next one was overdue too: it goes at once
    steps = [TERM, TERM]
    t = 60.0
    while steps[-1] is not KILL:
        t = max(t, run.deadline)
        step = run.due(t)
        assert step is not None
        steps.append(step)
    assert steps == [TERM, TERM, TERM, KILL]


def test_a_late_tick_compresses_the_ladder_instead_of_stretching_it() -> None:
    run = LadderRun(P, 0.0)  # worst case 25s
    # The loop was busy until 20s: SIGTERM 1 (due at 10s) goes out at 20s. From then on the
    # caller ticks exactly at each deadline, as the instance does with call_at.
    t = 20.0
    sent = []
    while True:
        step = run.due(t)
        assert step is not None
        sent.append((t, step))
        if step is KILL:
            break
        t = max(t, run.deadline)
    assert sent[-1][0] <= worst_case(P)


# ---- time_to_kill --------------------------------------------------------------------------
def test_time_to_kill_along_the_ladder() -> None:
    run = LadderRun(P, 100.0)
    assert run.time_to_kill(100.0) == 25.0
    assert run.time_to_kill(104.0) == 21.0
    run.due(110.0)
    assert run.time_to_kill(110.0) == 15.0
    assert run.time_to_kill(112.0) == 13.0
    run.due(115.0), run.due(120.0)
    assert run.time_to_kill(120.0) == 5.0
    assert run.time_to_kill(124.5) == 0.5
    assert run.due(125.0) is KILL
    assert run.time_to_kill(125.0) == 0.0
    assert run.time_to_kill(200.0) == 0.0


def test_time_to_kill_after_skip_grace_and_when_overdue() -> None:
    run = LadderRun(P, 100.0)
    run.skip_grace(104.0)
    assert run.time_to_kill(104.0) == 15.0
    overdue = LadderRun(P, 100.0)
    assert overdue.time_to_kill(500.0) == 0.0  # never negative
    no_term = LadderRun(policy(attempts=0, grace=3), 0.0)
    assert no_term.time_to_kill(1.0) == 2.0


# ---- properties ----------------------------------------------------------------------------
policies = st.builds(
    StopPolicy,
    grace=st.floats(0, 100, allow_nan=False),
    attempts=st.integers(0, 6),
    interval=st.floats(0.01, 50, allow_nan=False),
    kill_interval=st.floats(0.01, 10, allow_nan=False),
)
# Each tick: (how far into the wait an early, ignored tick comes, how late the real tick is).
ticks = st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.floats(0, 40)), max_size=25)
LETTER = {ASK: "A", TERM: "T", KILL: "K"}


def _eps(*xs: float) -> float:
    return 1e-9 * max(1.0, *(abs(x) for x in xs))


@settings(max_examples=150, deadline=None)
@given(pol=policies, start=st.floats(0, 1e6), plan=ticks)
def test_steps_are_a_prefix_of_the_ladder_and_kill_never_comes_early(
    pol: StopPolicy, start: float, plan: list[tuple[float, float]]
) -> None:
    run = LadderRun(pol, start)
    steps, t, first_kill = [ASK], start, None
    for early, late in plan:
        if run.deadline > t:
            probe = t + (run.deadline - t) * early
            if probe < run.deadline:
                before = run.deadline
                assert run.due(probe) is None
                assert run.deadline == before
        t = max(t, run.deadline) + late
        step = run.due(t)
        assert step is not None
        steps.append(step)
        if step is KILL and first_kill is None:
            first_kill = t
    word = "".join(LETTER[s] for s in steps)
    assert re.fullmatch(rf"A(T{{0,{pol.attempts}}}|T{{{pol.attempts}}}K+)", word), word
    assert [s for _, s in run.sent] == steps
    times = [at for at, _ in run.sent]
    assert times == sorted(times)
    if first_kill is not None:
        wc = start + worst_case(pol)
        assert first_kill >= wc - _eps(wc)


@settings(max_examples=100, deadline=None)
@given(pol=policies, start=st.floats(0, 1e6), kills=st.integers(1, 5))
def test_punctual_ticks_follow_the_exact_schedule(pol: StopPolicy, start: float, kills: int
                                                  ) -> None:
    run = LadderRun(pol, start)
    got = on_time(run, pol.attempts + kills)
    expected = ([start + pol.grace + i * pol.interval for i in range(pol.attempts)]
                + [start + worst_case(pol) + i * pol.kill_interval for i in range(kills)])
    assert [s for _, s in got] == [TERM] * pol.attempts + [KILL] * kills
    for (t, _), want in zip(got, expected, strict=True):
        assert abs(t - want) <= _eps(want) * 10
    assert run.time_to_kill(got[-1][0]) == 0.0
