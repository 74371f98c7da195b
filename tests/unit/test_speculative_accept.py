"""What a row keeps of a speculative step (exod.runner.serving.speculative.accept): mlx-lm's rule
(drafts kept while they equal the model's token at their place, then the model's own token),
the first token of a new row, a row that does not speculate, and a request that ends inside
the tokens kept. Pure Python."""

from __future__ import annotations

from collections.abc import Callable

from exod.runner.serving.speculative.accept import FRESH, agreed, judge


def never(token: int) -> str | None:
    return None


def after(n: int) -> Callable[[int], str | None]:
    """A request of `n` tokens at most."""
    seen = [0]

    def finish(token: int) -> str | None:
        seen[0] += 1
        return "length" if seen[0] >= n else None

    return finish


def test_the_leading_drafts_that_equal_the_models_tokens_are_kept() -> None:
    assert agreed([4, 5, 6], [4, 5, 6, 7]) == 3
    assert agreed([4, 9, 6], [4, 5, 6, 7]) == 1  # a match after a miss counts for nothing
    assert agreed([9, 5, 6], [4, 5, 6, 7]) == 0
    assert agreed([], [4]) == 0


def test_every_draft_kept_then_the_models_next_token() -> None:
    v = judge([4, 5, 6], [4, 5, 6, 7], speculates=True, fresh=None, finish=never)
    assert (v.tokens, v.positions, v.accepted, v.finish) == ([4, 5, 6, 7], [0, 1, 2, 3], 3, None)
    assert v.keep == 4  # all k+1 tokens the model read stay in its cache: no rewind


def test_a_rejected_draft_gives_the_models_token_in_its_place() -> None:
    v = judge([4, 9, 6], [4, 5, 6, 7], speculates=True, fresh=None, finish=never)
    assert (v.tokens, v.positions, v.accepted) == ([4, 5], [0, 1], 1)
    assert v.keep == 2  # the row's last token and the one draft kept; 2 of 4 are rewound
    v = judge([9, 5, 6], [4, 5, 6, 7], speculates=True, fresh=None, finish=never)
    assert (v.tokens, v.accepted, v.keep) == ([4], 0, 1)


def test_a_row_that_does_not_speculate_keeps_no_draft_even_a_right_one() -> None:
    v = judge([4, 5], [4, 5, 6], speculates=False, fresh=None, finish=never)
    assert (v.tokens, v.positions, v.accepted, v.keep) == ([4], [0], 0, 1)


def test_a_new_rows_first_token_comes_first() -> None:
    v = judge([4, 5], [4, 8, 6], speculates=True, fresh=3, finish=never)
    assert (v.tokens, v.positions, v.accepted, v.keep) == ([3, 4, 8], [FRESH, 0, 1], 1, 2)


def test_a_request_ends_inside_the_tokens_kept_and_its_cache_keeps_what_came_before() -> None:
    v = judge([4, 5, 6], [4, 5, 6, 7], speculates=True, fresh=None, finish=after(2))
    assert (v.tokens, v.finish, v.accepted, v.keep) == ([4, 5], "length", 2, 2)
    stop = judge([4, 5, 6], [4, 5, 6, 7], speculates=True, fresh=None,
                 finish=lambda t: "stop" if t == 4 else None)
    assert (stop.tokens, stop.finish, stop.keep) == ([4], "stop", 1)
    first = judge([4], [4, 5], speculates=True, fresh=3, finish=after(1))  # max_tokens 1
    assert (first.tokens, first.finish, first.accepted, first.keep) == ([3], "length", 0, 0)
