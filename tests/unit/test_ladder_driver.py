"""The one ladder driver (exod.daemon.ladder_driver) on the fake seam's clock: each step at its
deadline, a hurry that skips only the grace, nothing after the reaping."""

from __future__ import annotations

from exod.config.schema import StopPolicy
from exod.core.ladder import Step
from exod.daemon.ladder_driver import LadderDriver
from tests.unit.fakes import FakeSeam

POLICY = StopPolicy(grace=10.0, drain=0.0, attempts=2, interval=5.0, kill_interval=1.0)


def driven(seam: FakeSeam) -> tuple[LadderDriver, list[tuple[float, Step]]]:
    steps: list[tuple[float, Step]] = []
    driver = LadderDriver(seam, POLICY, lambda step: steps.append((seam.now(), step)))
    driver.begin()
    return driver, steps


def test_each_step_at_its_deadline_and_sigkill_repeats() -> None:
    seam = FakeSeam(0.0)
    driver, steps = driven(seam)
    seam.advance(22.5)
    assert steps == [(0, Step.ASK), (10, Step.TERM), (15, Step.TERM), (20, Step.KILL),
                     (21, Step.KILL), (22, Step.KILL)]
    assert driver.current is Step.KILL and driver.time_to_kill(seam.now()) == 0.0


def test_hurry_skips_the_grace_only() -> None:
    seam = FakeSeam(0.0)
    driver, steps = driven(seam)
    seam.advance(3.0)
    driver.hurry()
    seam.advance(0.0)
    assert steps == [(0, Step.ASK), (3, Step.TERM)]
    assert driver.time_to_kill(seam.now()) == 10.0  # still every SIGTERM before SIGKILL


def test_nothing_is_sent_once_reaped() -> None:
    seam = FakeSeam(0.0)
    driver, steps = driven(seam)
    seam.advance(12.0)
    driver.reaped()
    driver.hurry()
    seam.advance(100.0)
    assert steps == [(0, Step.ASK), (10, Step.TERM)] and seam.pending() == []


def test_a_process_reaped_by_the_first_step_leaves_no_timer() -> None:
    seam = FakeSeam(0.0)
    holder: list[LadderDriver] = []
    driver = LadderDriver(seam, POLICY, lambda step: holder[0].reaped())
    holder.append(driver)
    driver.begin()
    assert seam.pending() == []
