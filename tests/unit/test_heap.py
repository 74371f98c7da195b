"""The daemon hands freed memory back to the system once a period after a busy one
(exod.daemon.heap), on the seam's clock: never while idle."""

from __future__ import annotations

import time

from exod.daemon.heap import PERIOD, HeapTrim, _releaser
from tests.unit.fakes import FakeSeam


def trimmer() -> tuple[FakeSeam, HeapTrim, list[float]]:
    seam = FakeSeam()
    calls: list[float] = []
    return seam, HeapTrim(seam, release=lambda: calls.append(seam.now())), calls


def test_an_idle_daemon_never_trims() -> None:
    seam, heap, calls = trimmer()
    seam.advance(10 * PERIOD)
    assert calls == [] and seam.pending() == []


def test_a_busy_period_is_trimmed_once_at_its_end() -> None:
    seam, heap, calls = trimmer()
    heap.touched()
    seam.advance(PERIOD / 2)
    heap.touched()  # the same period: no second timer
    assert len(seam.pending()) == 1
    seam.advance(PERIOD)
    assert calls == [1000.0 + PERIOD] and heap.trims == 1  # FakeSeam starts at 1000
    seam.advance(5 * PERIOD)  # idle again: nothing more
    assert len(calls) == 1 and seam.pending() == []
    heap.touched()
    seam.advance(PERIOD)
    assert len(calls) == 2


def test_close_disarms_the_timer() -> None:
    seam, heap, calls = trimmer()
    heap.touched()
    heap.close()
    seam.advance(2 * PERIOD)
    assert calls == []


def test_a_failing_release_is_a_log_line_not_an_error() -> None:
    seam = FakeSeam()

    def fails() -> None:
        raise OSError("no")

    heap = HeapTrim(seam, release=fails)
    heap.touched()
    seam.advance(PERIOD)
    assert heap.trims == 0 and seam.pending() == []


def test_the_c_library_call_exists_and_is_cheap() -> None:
    release = _releaser()
    assert release is not None
    junk = [bytes(5000 + i) for i in range(20_000)]  # ~100 MB freed below the heap's top
    del junk[::2]
    t = time.perf_counter()
    release()
    assert time.perf_counter() - t < 1.0  # a safety bound: well under a millisecond usually
