"""The thinking budget of a free request (exod.runner.serving.think_budget): the end-of-think
marker is forced once the reasoning has its tokens, counted over every block, and nothing else
is touched. mlx on the CPU, tiny arrays: milliseconds."""

from __future__ import annotations

import mlx.core as mx
import pytest

from exod.runner.serving.think_budget import ThinkBudget

START, END, WIDTH = 5, 6, 10
PROMPT = [1, START, 9]  # the chat template opened the block


def forced(budget: ThinkBudget, history: list[int]) -> bool:
    """Whether the call after `history` leaves only the end marker."""
    out = budget(mx.array(history), mx.zeros((1, WIDTH)))
    values: list[float] = out.reshape(-1).tolist()  # type: ignore[assignment]
    allowed = [i for i, x in enumerate(values) if x != float("-inf")]
    assert allowed in ([END], list(range(WIDTH)))
    return allowed == [END]


def steps(budget: ThinkBudget, prompt: list[int], generated: list[int]) -> list[bool]:
    """Forced or not, at each step of a generation (the first call sees the prompt alone)."""
    return [forced(budget, prompt + generated[:i]) for i in range(len(generated) + 1)]


def test_an_opened_block_closes_after_its_budget_then_the_answer_is_free() -> None:
    # Prompt tokens after the start marker (the template's newline) are not reasoning.
    assert steps(ThinkBudget((START, END), True, 2), PROMPT, [3, 4, END, 7, 8]) == \
        [False, False, True, False, False, False]


def test_a_block_closed_in_time_is_left_alone() -> None:
    assert steps(ThinkBudget((START, END), True, 3), PROMPT, [3, END, 7, 8, 2]) == [False] * 6


def test_the_budget_counts_every_block_and_no_marker() -> None:
    # Closed after 1 token and no block in the prompt: a second block gets the 1 left.
    assert steps(ThinkBudget((START, END), False, 2), [1, 2],
                 [7, START, 3, END, 8, START, 4, END]) == \
        [False, False, False, False, False, False, False, True, False]


def test_no_block_no_forcing_and_a_marker_beyond_the_logits_is_never_forced() -> None:
    assert steps(ThinkBudget((START, END), False, 1), [1, 2], [3, 4, 7]) == [False] * 4
    wide = ThinkBudget((START, WIDTH + 3), True, 1)
    wide(mx.array(PROMPT), mx.zeros((1, WIDTH)))
    assert wide(mx.array(PROMPT + [3, 4]), mx.zeros((1, WIDTH))).tolist() == [[0.0] * WIDTH]


@pytest.mark.parametrize("budget", [1, 4])
def test_at_most_budget_tokens_of_reasoning_when_the_model_never_stops(budget: int) -> None:
    """A model that would think forever: greedy on logits that prefer token 3 over the end."""
    processor, history = ThinkBudget((START, END), True, budget), list(PROMPT)
    for _ in range(budget + 3):
        logits = mx.array([[0.0, 0, 0, 9, 0, 0, 1, 0, 0, 0]])
        history.append(int(mx.argmax(processor(mx.array(history), logits)).item()))  # type: ignore[arg-type]
    assert history[len(PROMPT):] == [3] * budget + [END, 3, 3]
