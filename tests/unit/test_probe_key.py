"""The probe's cache key covers the code the probe really runs: the split package and every exod
module it imports, found from the sources, so a rename or an edit there is a new answer."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from exod.facts import probe

EXOD = Path(probe.__file__).resolve().parents[1]


def digest_of(package: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(probe, "_PACKAGE", package)
    probe.code_digest.cache_clear()
    try:
        return probe.code_digest()
    finally:
        probe.code_digest.cache_clear()


def test_the_key_covers_the_split_package_and_what_it_imports() -> None:
    mods = probe.probe_modules()
    split = {f"exod.runner.split.{p.stem}" for p in (EXOD / "runner/split").glob("*.py")
             if p.stem != "__init__"}
    assert split <= mods
    assert "exod.runner.serving.can_batch" in mods  # imported by the probe, outside split/
    assert "exod.runner.serving.batch_engine" not in mods  # not imported: not in the key
    assert all(m.startswith("exod") for m in mods)


@pytest.mark.parametrize("edit", ["runner/split/shapes.py", "runner/serving/can_batch.py"])
def test_an_edit_to_any_module_the_probe_runs_changes_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: str) -> None:
    copy = tmp_path / "exod"
    shutil.copytree(EXOD, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = digest_of(copy, monkeypatch)
    with (copy / edit).open("a") as f:
        f.write("\n# changed\n")
    assert digest_of(copy, monkeypatch) != before


def test_a_new_module_in_split_changes_the_key(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "exod"
    shutil.copytree(EXOD, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = digest_of(copy, monkeypatch)
    (copy / "runner/split/renamed.py").write_text("X = 1\n")
    assert digest_of(copy, monkeypatch) != before


def test_a_missing_probe_is_an_error_not_a_stale_key(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "exod"
    shutil.copytree(EXOD, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "runner/split/probe.py").unlink()
    with pytest.raises(OSError):
        digest_of(copy, monkeypatch)


def test_without_the_probe_s_code_there_is_no_answer_rather_than_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "exod"
    shutil.copytree(EXOD, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "runner/split/probe.py").unlink()
    monkeypatch.setattr(probe, "_PACKAGE", copy)
    probe.code_digest.cache_clear()
    try:
        assert probe.answers([(tmp_path, 2, "pipeline", None)]) == [None]
    finally:
        probe.code_digest.cache_clear()
