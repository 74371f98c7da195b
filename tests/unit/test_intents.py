"""What follows a stop (exod.core.intents): how a second request during a stop merges into the
intent the STOPPING state carries, and the instance honouring each intent."""

from __future__ import annotations

from pathlib import Path

import pytest

from exod.config.schema import Instance
from exod.core.intents import (Again, Hold, Intent, Recover, Retire, StayStopped, holds, on_retire,
                               on_start, on_stop)
from exod.core.restarts import Restart
from exod.core.states import State
from tests.unit.fakes import FakeSeam
from tests.unit.test_instance import T0, ready

NEW = Instance(name="llama", model=Path("/models/other"))
RECOVER = Recover(Restart(2.0))
RETIRE = Retire(None, hold=False, restart=True)


@pytest.fixture
def seam() -> FakeSeam:
    return FakeSeam(T0)


@pytest.mark.parametrize("current, operator, expected", [
    (None, False, StayStopped()), (None, True, Hold()),
    (StayStopped(), True, Hold()), (Hold(), False, Hold()),  # a hold outlasts a later plain stop
    (Again(True), False, StayStopped()), (Again(True), True, Hold()),  # a stop cancels the start
    (RECOVER, False, StayStopped()),  # ... and the restart a failure would have had
    (RETIRE, False, RETIRE), (RETIRE, True, Retire(None, hold=True, restart=True)),
])
def test_a_stop_cancels_what_would_follow_and_an_operators_holds(
        current: Intent | None, operator: bool, expected: Intent) -> None:
    assert on_stop(current, operator) == expected


@pytest.mark.parametrize("current, operator, expected", [
    (StayStopped(), False, Again(False)), (Hold(), True, Again(True)), (RECOVER, True, Again(True)),
    (Again(True), False, Again(True)),  # an operator's start stays one
    (Retire(None, hold=True, restart=True), True, Retire(None, hold=False, restart=True)),
    (Retire(None, hold=True, restart=True), False, Retire(None, hold=True, restart=True)),
])
def test_a_start_during_a_stop_follows_it_unless_the_runtime_retires(
        current: Intent, operator: bool, expected: Intent) -> None:
    assert on_start(current, operator) == expected


def test_a_retirement_keeps_the_hold_and_the_latest_replacement() -> None:
    first = on_retire(Hold(), NEW, running=True)
    assert first == Retire(NEW, hold=True, restart=True) and holds(first)
    assert on_retire(first, None, running=False) == Retire(None, hold=True, restart=True)
    assert not holds(on_retire(None, NEW, running=False))


def test_the_instance_carries_its_intent_only_while_it_matters(seam: FakeSeam) -> None:
    inst, (pid,) = ready(seam)
    assert inst.job is None and not inst.held
    inst.stop(operator=True)
    assert inst.state is State.STOPPING and inst.job is not None and inst.job.then == Hold()
    inst.retire(NEW)  # a reload during an operator's stop: the replacement is held as well
    assert inst.retiring and inst.held and not inst.retired
    inst.retire(None)  # then removed by a second reload: the latest wins
    seam.exit(pid, code=0)
    assert inst.retired and seam.retirements == [(T0, "llama", Retire(None, True, True))]


def test_a_hold_ends_with_an_operators_start(seam: FakeSeam) -> None:
    inst, (pid,) = ready(seam)
    inst.stop(operator=True)
    seam.exit(pid, code=0)
    assert inst.state is State.STOPPED and inst.held
    inst.stop()  # a plain stop of a held instance (exod stopping) keeps it held
    assert inst.held
    inst.start(operator=True)
    assert inst.state is State.STARTING and inst.job is None and not inst.held


def test_a_failure_stop_recovers_by_the_policy(seam: FakeSeam) -> None:
    inst, (p0, p1) = ready(seam, ranks=2)
    seam.exit(p0, code=1)
    assert inst.state is State.STOPPING and inst.job is not None
    assert isinstance(inst.job.then, Recover) and not inst.start_pending
    seam.exit(p1, code=0)
    assert inst.state is State.BACKOFF and inst.job is None
