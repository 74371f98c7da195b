"""The names a request may give a model (exod.core.names): an instance's own or an alias, with
or without `:latest`, and the clashes the config refuses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exod.cli.exod import serving_lines
from exod.config.schema import Instance, KeepAliveBounds
from exod.core.names import ALIAS_RE, Names, clashes, tagged


def test_a_name_without_a_tag_is_latest() -> None:
    assert tagged("tiny") == "tiny:latest"
    assert tagged("qwen3:8b") == "qwen3:8b"
    assert tagged("library/llama3.2") == "library/llama3.2:latest"
    assert tagged("localhost:5000/llama3") == "localhost:5000/llama3:latest"  # a port, not a tag
    assert tagged("hf.co/org/name:Q4_K_M") == "hf.co/org/name:Q4_K_M"


def test_names_and_aliases_answer_with_or_without_latest() -> None:
    names = Names({"tiny": ("llama3.2", "qwen3:8b"), "big": ()})
    for given, want in [("tiny", "tiny"), ("tiny:latest", "tiny"), ("llama3.2", "tiny"),
                        ("llama3.2:latest", "tiny"), ("qwen3:8b", "tiny"), ("big:latest", "big")]:
        assert names.instance(given) == want, given
    for other in ("qwen3", "qwen3:latest", "tiny:8b", "llama3.2:1b", "Tiny", "big:"):
        assert names.instance(other) is None, other


def test_an_instance_name_wins_over_another_instances_alias() -> None:
    assert Names({"a": ("b",), "b": ()}).instance("b") == "b"


def test_clashes_name_the_alias_and_who_answers_to_it() -> None:
    assert clashes({"a": ("x", "b:latest"), "b": ("x:latest",), "c": ("c",)}) == [
        ("a", "b:latest", "b"), ("b", "x:latest", "a"), ("c", "c", "c")]
    assert clashes({"a": ("llama3.2", "qwen3:8b"), "b": ("qwen3",)}) == []


@pytest.mark.parametrize("alias", ["llama3.2", "qwen3:8b", "hf.co/org/name:Q4_K_M",
                                   "library/llama3.2:latest"])
def test_aliases_as_ollamas_clients_write_them(alias: str) -> None:
    assert re.match(ALIAS_RE, alias)


@pytest.mark.parametrize("alias", ["", ":latest", "a:", "a:b:c", "-a", "a b", "a\n", "llamä"])
def test_malformed_aliases(alias: str) -> None:
    assert not re.match(ALIAS_RE, alias)


def test_exod_check_shows_names_and_keep_alive_bounds() -> None:
    inst = Instance(name="coder", model=Path("m"), aliases=("qwen3:8b", "llama3.2"),
                    autostart="on-demand", idle_stop_after=900.0,
                    keep_alive=KeepAliveBounds(min=60.0))
    assert serving_lines(inst) == [
        "coder: also answers to qwen3:8b, llama3.2",
        "coder: on demand: stops after 15m without a request; a request's keep_alive may set "
        "that from 1m to never"]
    assert serving_lines(Instance(name="x", model=Path("m"))) == []


def test_a_reload_that_changes_only_aliases_changes_no_instance() -> None:
    """The daemon reads aliases from its current config: the runner keeps serving."""
    before = Instance(name="x", model=Path("m"), aliases=("a",))
    assert before == Instance(name="x", model=Path("m"), aliases=("b", "c"))
