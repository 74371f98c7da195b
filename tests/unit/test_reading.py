"""The serve loop's reader: requests read in order on a thread of their own; dropped ones are
thrown away; progress is said only for a request still wanted."""

from __future__ import annotations

import queue
import threading
import time

from exod.wire import messages as m
from exod.runner.serving.reading import Prompt, Read, Reader
from exod.core.request_rules import RequestError


def gen(rid: str) -> m.Generate:
    return m.Generate(id=rid, kind="completion", prompt=rid, max_tokens=1)


class Slow:
    """A read that waits until released, so a test can act while it is under way."""

    def __init__(self) -> None:
        self.started: queue.Queue[str] = queue.Queue()
        self.release = threading.Event()
        self.read: list[str] = []

    def __call__(self, req: m.Generate) -> Prompt:
        self.started.put(req.id)
        assert self.release.wait(30)
        self.read.append(req.id)
        if req.id == "bad":
            raise RequestError("the prompt is empty", "prompt")
        return Prompt([1, 2, 3], 1)


def test_reads_in_order_and_hands_back_results_and_errors() -> None:
    slow, done = Slow(), queue.Queue[Read]()
    r = Reader(slow, done.put, lambda rid: None, every=60)
    slow.release.set()
    for rid in ("a", "bad", "b"):
        r.submit(gen(rid))
    got = [done.get(timeout=30) for _ in range(3)]
    assert [g.req.id for g in got] == ["a", "bad", "b"]
    assert got[0].prompt == Prompt([1, 2, 3], 1) and got[0].error is None
    assert isinstance(got[1].error, RequestError) and got[1].prompt is None
    assert all(r.take(g) for g in got) and not r.pending


def test_a_dropped_request_is_not_read_or_is_thrown_away() -> None:
    slow, done = Slow(), queue.Queue[Read]()
    r = Reader(slow, done.put, lambda rid: None, every=60)
    r.submit(gen("a"))
    r.submit(gen("b"))
    assert slow.started.get(timeout=30) == "a"  # "a" is under the tokenizer, "b" waits
    assert r.drop("a") and r.drop("b") and not r.drop("b")
    slow.release.set()
    r.submit(gen("c"))
    got = [done.get(timeout=30) for _ in range(2)]
    assert [g.req.id for g in got] == ["a", "c"]  # "b" was never read
    assert slow.read == ["a", "c"]
    assert not r.take(got[0])  # dropped while read: its result is not wanted
    assert r.take(got[1])


def test_progress_is_said_while_reading_only_for_a_request_still_wanted() -> None:
    slow, done = Slow(), queue.Queue[Read]()
    said: queue.Queue[str] = queue.Queue()
    r = Reader(slow, done.put, said.put, every=0.01)
    r.submit(gen("a"))
    assert said.get(timeout=30) == "a"  # the read is under way and reported
    assert r.drop_all() == ["a"]
    before = said.qsize()
    # Proving a negative: 20 periods of `every` with the read still under way.
    time.sleep(0.2)
    slow.release.set()
    done.get(timeout=30)
    # At most one more: a `say` that had checked just before the drop.
    assert said.qsize() - before <= 1
