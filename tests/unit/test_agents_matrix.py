"""docs/agents.md's conformance matrix (tests.agents.matrix): the page's section is the rendering
of docs/agents-matrix.json, which holds every cell the suite records; observations are
appended only where EXOD_MATRIX_OUT names a file, and otherwise checked against the JSON's
claims, never its figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.agents import matrix
from tests.models.families import FAMILIES


def test_the_page_s_matrix_is_rendered_from_the_json() -> None:
    """Run `python -m tests.agents.matrix render` after changing the JSON or the rendering,
    `make agents-matrix` after changing what the tests observe."""
    page = matrix.PAGE.read_text(encoding="utf-8")
    assert matrix.section(page) == matrix.render(matrix.committed_now())


def test_the_json_holds_every_cell_of_the_matrix() -> None:
    data = matrix.committed_now()
    cells = data["cells"]
    for agent in matrix.AGENTS:
        for fmt in matrix.FORMATS:
            assert cells[agent][fmt]["session"] is True, (agent, fmt)
    assert set(cells[matrix.ENGINE]) == set(FAMILIES)
    assert {"claude-code", "codex", "opencode", "openai-agents", "pydantic-ai"} <= \
        set(data["versions"])


def test_nothing_is_recorded_unless_a_file_is_named(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "results.jsonl"
    monkeypatch.delenv(matrix.ENV, raising=False)
    matrix.record("codex", "harmony", "session", True)
    assert not out.exists()
    monkeypatch.setenv(matrix.ENV, str(out))
    matrix.saw("codex", "harmony", session=True, answers=3)  # recording: never checked
    matrix.saw("codex", "harmony", reuse_floor=0.91234567)
    cells = matrix.cells_of(out.read_text().splitlines())
    assert cells == {"codex": {"harmony": {"answers": 3, "reuse_floor": 0.9123,
                                           "session": True}}}


CELLS = {"codex": {"harmony": {"session": True, "leaks": 0, "answers": 2, "reuse": 0.95,
                               "past_window_told": "compacts"}}}


@pytest.mark.parametrize("key, value, wrong", [
    ("session", True, False),
    ("leaks", 0, False),
    ("leaks", 1, True),
    ("answers", 7, False),  # a figure: never held to the JSON
    ("reuse", 0.91, False),  # the same class: 90% or more
    ("reuse", 0.5, True),
    ("past_window_told", "compacts", False),
    ("past_window_told", "exits", True),
    ("forced", True, True),  # a claim the JSON lacks
])
def test_a_changed_claim_is_named_and_a_figure_is_not(key: str, value: object,
                                                      wrong: bool) -> None:
    said = matrix.mismatch(CELLS, "codex", "harmony", key, value)
    assert bool(said) == wrong, said
    if wrong:
        assert said.startswith("the matrix in docs/agents-matrix.json says ")
        assert said.endswith("run make agents-matrix")


def test_a_session_the_json_lacks_is_one_it_says_does_not_pass() -> None:
    said = matrix.mismatch(CELLS, "opencode", "harmony", "session", True)
    assert "says it does not pass" in said and "the suite saw true" in said


def test_a_missing_cell_renders_as_not_passing() -> None:
    data = json.loads(json.dumps(matrix.committed_now()))
    del data["cells"]["opencode"]["harmony"]["session"]
    assert "❌ did not pass" in matrix.render(data)
