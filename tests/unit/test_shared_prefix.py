"""Who follows whom among prompts in flight (exod.runner.serving.shared_prefix): pure logic."""

from __future__ import annotations

from dataclasses import dataclass

from exod.runner.serving.shared_prefix import Sharing, common_prefix


@dataclass
class Lead:
    rid: str
    prompt: list[int]
    in_cache: int = 0


SHARED = list(range(1000, 1600))  # 600 tokens


def test_common_prefix_counts_across_blocks() -> None:
    assert common_prefix(SHARED + [1, 2], SHARED + [1, 3]) == 601
    assert common_prefix([], SHARED) == 0
    assert common_prefix(SHARED, SHARED) == 600
    assert common_prefix(SHARED[:300], SHARED) == 300
    assert common_prefix([5, *SHARED], SHARED) == 0


def test_a_prompt_follows_the_leader_that_shares_the_most() -> None:
    s = Sharing(min_shared=256, exact=True)
    short, long = Lead("a", SHARED[:400] + [7]), Lead("b", SHARED + [8])
    assert s.choose(SHARED + [9, 9], covered=0, leaders=[short, long]) == ("b", 600)


def test_too_little_in_common_beyond_its_own_cache_prefills_alone() -> None:
    s = Sharing(min_shared=256, exact=True)
    lead = Lead("a", SHARED + [1])
    assert s.choose(SHARED[:200] + [2], 0, [lead]) is None
    assert s.choose(SHARED + [2], covered=400, leaders=[lead]) is None  # 200 more: too few
    assert s.choose(SHARED + [2], covered=300, leaders=[lead]) == ("a", 600)


def test_the_last_prompt_token_is_never_shared() -> None:
    s = Sharing(min_shared=256, exact=True)
    assert s.choose(SHARED, 0, [Lead("a", SHARED + [1])]) == ("a", 599)


def test_a_leader_past_the_point_is_followed_only_when_its_cache_rewinds() -> None:
    past = Lead("a", SHARED + [1, 2, 3], in_cache=603)
    assert Sharing(256, exact=True).choose(SHARED + [4], 0, [past]) == ("a", 600)
    assert Sharing(256, exact=False).choose(SHARED + [4], 0, [past]) is None


def test_exact_followers_are_due_when_the_leader_holds_their_part() -> None:
    s = Sharing(256, exact=True)
    s.follow("f", "a", 600)
    assert s.due("a", in_cache=512, chunk=256) == []
    assert [f.rid for f in s.due("a", in_cache=600, chunk=256)] == ["f"]
    assert s.leaders == [] and not s.waiting("f")


def test_other_followers_are_due_at_the_last_boundary_before_their_part_ends() -> None:
    s = Sharing(256, exact=False)
    s.follow("f", "a", 600)
    assert s.due("a", in_cache=256, chunk=256) == []
    assert [f.rid for f in s.due("a", in_cache=512, chunk=256)] == ["f"]  # 768 would pass it


def test_a_leader_that_leaves_releases_its_followers_and_a_follower_that_leaves_is_gone() -> None:
    s = Sharing(256, exact=True)
    s.follow("f1", "a", 600)
    s.follow("f2", "a", 600)
    s.drop("f1")
    assert [f.rid for f in s.release("a")] == ["f2"]
    assert s.leaders == [] and not s.waiting("f2")


def test_a_burst_reads_a_disk_entry_once() -> None:
    s = Sharing(256, exact=False)
    s.loads("a", "entry", 600)
    assert s.join_load("b", "entry", 600)
    assert not s.join_load("c", "entry", 500)  # covering less: only with a rewindable cache
    assert not s.join_load("d", "other", 600)
    s.loaded("a")
    assert not s.join_load("e", "entry", 600)
    exact = Sharing(256, exact=True)
    exact.loads("a", "entry", 600)
    assert exact.join_load("c", "entry", 500)
    assert [f.upto for f in exact.due("a", in_cache=600, chunk=0)] == [500]
