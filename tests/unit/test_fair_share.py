"""The fair share of the batch (exod.runner.serving.fair_share), pure: whom a full batch starts
next, whom it holds back, and the tokens keys get over a deterministic schedule (a batch of
rows stepped as the engine steps it: each row a prompt chunk or a decoded token a step)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from exod.runner.serving.fair_share import FairShare, Priority


@dataclass
class Req:
    rid: str
    key: str
    prompt: int  # tokens to prefill
    tokens: int  # tokens to decode
    done: int = 0


def simulate(share: FairShare, width: int, keys: dict[str, tuple[float, Priority]],
             steps: int, prompt: int = 40, tokens: int = 30, chunk: int = 32,
             clients: int = 16) -> dict[str, int]:
    """Every key keeps `clients` requests in (a new one as each ends, as clients do); the
    tokens served to each key (prefill and decode) over `steps` steps, once past the first
    half (the shares settled)."""
    ids = itertools.count()
    reqs: dict[str, Req] = {}

    def send(key: str) -> None:
        r = Req(f"{key}{next(ids)}", key, prompt, tokens)
        reqs[r.rid] = r
        share.arrive(r.rid, key, *keys[key])

    for key in keys:
        for _ in range(clients):
            send(key)
    served = dict.fromkeys(keys, 0)
    for step in range(steps):
        running = [rid for rid, e in share.entries.items() if e.running]
        while len(running) < width and (rid := share.next()) is not None:
            share.start(rid)
            running.append(rid)
        for rid in running:
            r = reqs[rid]
            n = min(chunk, r.prompt - r.done) if r.done < r.prompt else 1
            r.done += n
            share.served(rid, n)
            if step >= steps // 2:
                served[r.key] += n
            if r.done >= r.prompt + r.tokens:
                share.gone(rid)
                del reqs[rid]
                send(r.key)
    return served


@pytest.mark.parametrize("width", [4, 8, 16])
def test_weights_three_to_one_split_the_tokens_three_to_one(width: int) -> None:
    served = simulate(FairShare(), width, {"c": (3.0, "interactive"), "d": (1.0, "interactive")},
                      steps=4000)
    assert served["c"] / served["d"] == pytest.approx(3.0, rel=0.10), served


def test_equal_weights_split_evenly_whoever_sends_more() -> None:
    keys: dict[str, tuple[float, Priority]] = {"a": (1.0, "interactive"),
                                               "b": (1.0, "interactive")}
    fair = simulate(FairShare(), 8, keys, steps=3000)
    assert fair["a"] / fair["b"] == pytest.approx(1.0, rel=0.10), fair
    # a keeps 16 requests in, b 2: first come first served gives a its 16 to b's 2.
    assert simulate_uneven(FairShare())["a"] == pytest.approx(
        simulate_uneven(FairShare())["b"], rel=0.15)
    lopsided = simulate_uneven(FairShare("fifo"))
    assert lopsided["a"] > 4 * lopsided["b"], lopsided


def simulate_uneven(share: FairShare) -> dict[str, int]:
    """a keeps 16 requests in, b keeps 2: a batch of 4."""
    ids = itertools.count()
    left: dict[str, int] = {}
    keys = {"a": 16, "b": 2}
    for key, n in keys.items():
        for _ in range(n):
            rid = f"{key}{next(ids)}"
            left[rid] = 20
            share.arrive(rid, key)
    served = dict.fromkeys(keys, 0)
    for _ in range(2000):
        running = [rid for rid, e in share.entries.items() if e.running]
        while len(running) < 4 and (rid := share.next()) is not None:
            share.start(rid)
            running.append(rid)
        for rid in running:
            key = share.entries[rid].key
            share.served(rid, 1)
            served[key] += 1
            left[rid] -= 1
            if not left[rid]:
                share.gone(rid)
                new = f"{key}{next(ids)}"
                left[new] = 20
                share.arrive(new, key)
    return served


def test_a_full_batch_starts_the_least_served_key_next() -> None:
    share = FairShare()
    for n in range(4):
        share.arrive(f"a{n}", "a")
    share.start("a0")
    share.start("a1")
    share.served("a0", 100)
    share.arrive("b0", "b")  # new: at a's virtual time, and a is served meanwhile
    share.served("a1", 1)
    assert share.next() == "b0"
    share.start("b0")
    assert share.next() == "a2"  # a's own in order of arrival


def test_a_new_key_starts_at_the_least_virtual_time_not_zero() -> None:
    share = FairShare()
    share.arrive("a0", "a")
    share.start("a0")
    share.served("a0", 1000)
    share.arrive("b0", "b")
    assert share.vtime["b"] == share.vtime["a"] == 1000  # no credit for having been away
    share.gone("a0")
    share.gone("b0")
    assert share.vtime == {"a": 0, "b": 0}  # nobody in: from 0 again


def test_a_key_back_after_a_while_keeps_no_debt_beyond_the_others() -> None:
    share = FairShare()
    share.arrive("a0", "a")
    share.arrive("b0", "b")
    share.start("a0")
    share.start("b0")
    share.served("a0", 5000)  # a was served far more
    share.gone("a0")
    share.served("b0", 10)
    share.arrive("a1", "a")  # a comes back: its virtual time is its own, higher still
    share.arrive("b1", "b")
    assert share.next() == "b1"


def test_batch_priority_starts_only_when_no_interactive_request_waits() -> None:
    share = FairShare()
    share.arrive("x0", "night", priority="batch")
    share.arrive("d0", "day")
    share.served("d0", 10_000)  # however much the day was served
    assert share.next() == "d0"
    share.start("d0")
    assert share.next() == "x0"


def test_batch_work_is_held_back_for_waiting_interactive_work_only() -> None:
    share = FairShare()
    for rid in ("x0", "x1"):
        share.arrive(rid, "night", priority="batch")
        share.start(rid)
    share.arrive("y0", "other-night", priority="batch")
    share.start("y0")
    share.served("x0", 50)
    assert share.preempt(["x0", "x1", "y0"]) is None  # no interactive request waits
    share.arrive("d0", "day")
    # The key most served, the one started last.
    assert share.preempt(["x0", "x1", "y0"]) == "x1"
    assert share.preempt(["y0"]) == "y0"
    share.hold("x1")
    assert share.next() == "d0"
    share.start("d0")
    assert share.next() == "x1" and share.waiting() == 1  # held back: it waits in its place


def test_interactive_work_is_never_held_back() -> None:
    share = FairShare()
    share.arrive("a0", "a")
    share.start("a0")
    share.served("a0", 1_000_000)
    share.arrive("b0", "b")
    assert share.preempt(["a0"]) is None


def test_fifo_starts_in_order_of_arrival_and_holds_nobody_back() -> None:
    share = FairShare("fifo")
    share.arrive("x0", "night", priority="batch")
    share.start("x0")
    share.arrive("a0", "a")
    share.arrive("x1", "night", priority="batch")
    share.arrive("b0", "b")
    assert share.preempt(["x0"]) is None
    order = []
    while (rid := share.next()) is not None:
        share.start(rid)
        order.append(rid)
    assert order == ["a0", "x1", "b0"]


def test_weights_count_tokens_divided_by_weight() -> None:
    share = FairShare()
    share.arrive("c0", "c", weight=3.0)
    share.arrive("d0", "d", weight=1.0)
    share.served("c0", 300)
    share.served("d0", 100)
    assert share.vtime["c"] == share.vtime["d"] == 100
    share.served("d0", 1)
    share.arrive("c1", "c", weight=3.0)
    share.arrive("d1", "d", weight=1.0)
    assert share.next() == "c0" and share.rows() == {}


def test_batch_work_yields_while_an_interactive_request_is_in_its_prompt() -> None:
    share = FairShare()
    share.arrive("x0", "night", priority="batch")
    share.start("x0")
    share.arrive("x1", "night", priority="batch")
    share.arrive("d0", "day")
    share.start("d0")  # started, no token yet: still urgent
    assert share.urgent({"d0"}) and share.preempt(["x0"], {"d0"}) == "x0"
    assert share.next(batch=False) is None  # x1 waits while d0 is in its prompt
    assert not share.urgent(set()) and share.preempt(["x0"], set()) is None  # d0 answering
    assert share.next() == "x1"
