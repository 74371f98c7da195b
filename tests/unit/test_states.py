"""The state machine: the transition table, `Machine.move`, history."""

from __future__ import annotations

import itertools

import pytest

from exod.core.states import TRANSITIONS, IllegalTransition, Machine, State, Transition

ALL_PAIRS = list(itertools.product(State, State))


def test_table_has_a_row_for_every_state_and_names_only_states() -> None:
    assert set(TRANSITIONS) == set(State)
    for targets in TRANSITIONS.values():
        assert targets <= set(State)


@pytest.mark.parametrize(("old", "new"), ALL_PAIRS, ids=[f"{a}->{b}" for a, b in ALL_PAIRS])
def test_move_is_legal_iff_in_table(old: State, new: State) -> None:
    m = Machine(state=old, since=1.0, reason="before")
    legal = new in TRANSITIONS[old]
    assert m.can(new) is legal
    if legal:
        t = m.move(new, 2.0, "why")
        assert t == Transition(old, new, 2.0, "why")
        assert (m.state, m.since, m.reason) == (new, 2.0, "why")
        assert m.history == [t]
    else:
        with pytest.raises(IllegalTransition):
            m.move(new, 2.0, "why")
        assert (m.state, m.since, m.reason, m.history) == (old, 1.0, "before", [])


# Independent of the table: the lifecycle the module documents, and moves that must never happen.
LIFECYCLE = [State.STARTING, State.LOADING, State.READY, State.STOPPING, State.STOPPED]
NEVER = [
    (State.STOPPED, State.READY),  # ready is a message from a running runner
    (State.STOPPED, State.STOPPING),  # nothing to stop
    (State.STOPPED, State.BACKOFF),
    (State.STOPPING, State.STARTING),  # a start during a stop waits for the stop to end
    (State.STOPPING, State.READY),
    (State.FAILED, State.BACKOFF),  # failed stays put until an operator acts
    (State.FAILED, State.READY),
    (State.BACKOFF, State.READY),
    (State.BACKOFF, State.STOPPING),  # no process in backoff
]


def test_documented_lifecycle_is_legal() -> None:
    m = Machine()
    for i, s in enumerate(LIFECYCLE):
        m.move(s, float(i))
    assert [t.new for t in m.history] == LIFECYCLE
    assert [t.old for t in m.history] == [State.STOPPED, *LIFECYCLE[:-1]]


@pytest.mark.parametrize(("old", "new"), NEVER, ids=[f"{a}->{b}" for a, b in NEVER])
def test_moves_that_must_never_happen(old: State, new: State) -> None:
    with pytest.raises(IllegalTransition):
        Machine(state=old).move(new, 0.0)


@pytest.mark.parametrize("s", list(State))
def test_no_self_transitions(s: State) -> None:
    assert s not in TRANSITIONS[s]


def test_active_states() -> None:
    assert {s for s in State if s.active} == {
        State.DOWNLOADING, State.STARTING, State.LOADING, State.READY, State.STOPPING}


def test_state_str_and_value() -> None:
    assert str(State.READY) == "ready"
    assert f"{State.BACKOFF}" == "backoff"
    assert State("failed") is State.FAILED


def test_illegal_transition_message_names_both_states_and_the_reason() -> None:
    with pytest.raises(IllegalTransition) as e:
        Machine().move(State.READY, 5.0, "bogus READY")
    msg = str(e.value)
    assert "stopped" in msg and "ready" in msg and "bogus READY" in msg


def test_move_records_since_reason_and_ordered_history() -> None:
    m = Machine(since=0.5)
    m.move(State.STARTING, 1.0, "operator")
    m.move(State.LOADING, 2.5)
    m.move(State.FAILED, 4.0, "exit code 65")
    assert (m.state, m.since, m.reason) == (State.FAILED, 4.0, "exit code 65")
    assert m.history == [
        Transition(State.STOPPED, State.STARTING, 1.0, "operator"),
        Transition(State.STARTING, State.LOADING, 2.5, ""),
        Transition(State.LOADING, State.FAILED, 4.0, "exit code 65"),
    ]


@pytest.mark.parametrize("limit", [1, 3, 32])
def test_history_is_bounded_and_keeps_the_latest(limit: int) -> None:
    m = Machine(history_limit=limit)
    cycle = [State.STARTING, State.READY, State.STOPPING, State.STOPPED]
    for i in range(50):
        m.move(cycle[i % 4], float(i))
    assert len(m.history) == limit
    assert [t.at for t in m.history] == [float(i) for i in range(50 - limit, 50)]


def test_default_history_limit_is_bounded() -> None:
    m = Machine()
    for i in range(1000):
        m.move(State.STARTING if i % 2 == 0 else State.STOPPED, float(i))
    assert len(m.history) == m.history_limit == 32


def test_history_limit_zero_keeps_nothing() -> None:
    m = Machine(history_limit=0)
    m.move(State.STARTING, 1.0)
    m.move(State.STOPPED, 2.0)
    assert m.history == []
