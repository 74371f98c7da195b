"""A download's own state machine, driven through the fake seam's clock: its states and moves,
its fetcher stopped by the same ladder driver as runners' ranks, and its retries waiting by the
same backoff as restarts (jittered, and reset once bytes flowed for `reset_after`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exod.wire import messages as m
from exod.config.schema import BackoffPolicy, StopPolicy
from exod.core.exits import EXIT_TEMPFAIL
from exod.core.states import IllegalTransition, Tracked
from exod.daemon.downloads import FETCH_TRANSITIONS, Download, Downloads, Fetch, Outcome
from exod.core.hub_ref import HubRef
from tests.unit.fakes import ASK, KILL, TERM, FakeSeam

REF = HubRef("org/tiny")
STOP = StopPolicy(grace=10.0, drain=0.0, attempts=2, interval=5.0, kill_interval=1.0)


def downloads(seam: FakeSeam, jitter: float = 0.0, reset_after: float = 60.0) -> Downloads:
    seam.downloads = Downloads(seam, stall_after=60.0, stop=STOP, backoff=BackoffPolicy(
        initial=2.0, multiplier=2.0, max=30.0, jitter=jitter, reset_after=reset_after))
    return seam.downloads


def waiting(seam: FakeSeam, dl: Downloads) -> tuple[Download, list[Outcome]]:
    got: list[Outcome] = []
    return dl.want(REF, "owner", got.append), got


def fail_once(seam: FakeSeam, d: Download) -> float:
    """The fetcher fails on the network: the delay before the next attempt."""
    assert d.pid is not None
    seam.exit(d.pid, code=EXIT_TEMPFAIL)
    assert d.state is Fetch.BACKOFF
    return d.delay


def test_the_table_names_every_state_and_the_final_ones_lead_nowhere() -> None:
    assert set(FETCH_TRANSITIONS) == set(Fetch)
    for final in (Fetch.FETCHED, Fetch.FAILED, Fetch.DROPPED):
        assert FETCH_TRANSITIONS[final] == frozenset()
    with pytest.raises(IllegalTransition):
        Tracked(Fetch.NEW, FETCH_TRANSITIONS).move(Fetch.BACKOFF, 0.0)


def test_a_life_through_every_state_that_matters() -> None:
    seam = FakeSeam()
    d, got = waiting(seam, downloads(seam))
    assert d.state is Fetch.FETCHING and d.pid is not None
    seam.advance(60.0)  # no byte at all: stalled, stopped through the ladder
    assert d.state is Fetch.STOPPING and d.stalled and seam.steps(d.pid) == [(seam.now(), ASK)]
    seam.exit(d.pid, code=0)
    assert d.state is Fetch.BACKOFF and d.retry_in(seam.now()) == 2.0
    seam.advance(2.0)
    assert d.state is Fetch.FETCHING and not d.stalled and d.attempt == 1
    seam.send(d.pid, m.Fetched(path="/snap", commit="c" * 40))
    seam.exit(d.pid, code=0)
    assert d.state is Fetch.FETCHED and [o.path for o in got] == [Path("/snap")]
    assert [t.new for t in d.machine.history] == [
        Fetch.FETCHING, Fetch.STOPPING, Fetch.BACKOFF, Fetch.FETCHING, Fetch.FETCHED]
    assert seam.pending() == [] and not seam.downloads.by_key


def test_the_fetchers_ladder_is_the_ranks_ladder() -> None:
    seam = FakeSeam()
    dl = downloads(seam)
    d, _ = waiting(seam, dl)
    pid = d.pid
    assert pid is not None
    t0 = seam.now()
    dl.leave("owner", lambda: None)  # the last waiter leaves: its fetcher is stopped
    seam.advance(30.0)  # a fetcher that ignores the ask and every SIGTERM
    assert seam.steps(pid)[:4] == [(t0, ASK), (t0 + 10, TERM), (t0 + 15, TERM),
                                   (t0 + 20, KILL)]
    seam.exit(pid, sig=9)
    assert d.state is Fetch.DROPPED and seam.pending() == []


def test_retries_back_off_and_bytes_that_flowed_start_the_delays_over() -> None:
    seam = FakeSeam()
    d, _ = waiting(seam, downloads(seam, reset_after=60.0))
    assert fail_once(seam, d) == 2.0
    seam.advance(2.0)
    assert fail_once(seam, d) == 4.0  # no byte came: the outage goes on
    seam.advance(4.0)
    assert d.pid is not None
    for n in range(1, 8):  # bytes for 70 s: a good run
        seam.send(d.pid, m.DownloadProgress(done=n, total=100))
        seam.advance(10.0)
    assert fail_once(seam, d) == 2.0
    seam.advance(2.0)
    assert fail_once(seam, d) == 4.0 and d.attempt == 4


def test_retries_are_jittered() -> None:
    seam = FakeSeam()
    d, _ = waiting(seam, downloads(seam, jitter=0.5))
    delays = []
    for _ in range(12):
        delays.append(fail_once(seam, d))
        d.backoff.reset()  # the first delay again, drawn anew
        seam.advance(d.delay)
    assert all(1.0 <= x <= 3.0 for x in delays) and len(set(delays)) > 1


def test_a_spawn_failure_fails_the_waiters_at_once() -> None:
    seam = FakeSeam()
    dl = downloads(seam)

    def refuse(_: Download) -> int:
        raise OSError(2, "No such file or directory")

    seam.spawn_fetcher = refuse  # type: ignore[method-assign]
    d, got = waiting(seam, dl)
    assert d.state is Fetch.FAILED and got[0].error.startswith("cannot start the fetcher")
    assert d.pid is None and not dl.by_key and seam.pending() == []


def test_bytes_from_a_cluster_peer_are_said_to_come_from_it() -> None:
    seam = FakeSeam()
    d, _ = waiting(seam, downloads(seam))
    assert d.pid is not None
    seam.send(d.pid, m.DownloadProgress(done=10, total=100, source="node-1"))
    seam.advance(1.0)
    seam.send(d.pid, m.DownloadProgress(done=30, total=100, source="node-1"))
    assert d.describe(seam.now()).endswith(" from node-1")
    assert d.status(seam.now()).source == "node-1"
    seam.send(d.pid, m.DownloadProgress(done=40, total=100))  # the hub's bytes: no peer named
    assert " from " not in d.describe(seam.now()) and d.status(seam.now()).source is None
