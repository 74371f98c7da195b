"""What stands in exod's caches and is not what exod keeps there: a link out of the cache, a
FIFO, a folder where a file should be, a file where a folder should be, something that cannot be
removed or read. Each is taken for what it is: never followed out of the cache, never opened when
it would block, a link removed as a link (its target left as it is), and what was removed said
as it happened. The hub cache, the prompt cache's runner side and the daemon's `cache clear`;
through the API and exoctl, and what a user other than the cache's owner meets (a process of
its own): tests/integration/test_strange_cache.py."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exod import cache_files
from exod.hub import cache as hc
from exod.core.hub_ref import HubRef
from exod.runner.prompt_cache import fingerprint as fp
from exod.runner.prompt_cache.disk import DiskTier
from tests.immutable import immutable_files

REF = HubRef("org/tiny")
COMMIT = "c" * 40


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder out of every cache, with a file a link from a cache will point at."""
    where = tmp_path / "outside"
    where.mkdir()
    (where / "precious").write_bytes(b"p" * 1000)
    return where


def untouched(outside: Path) -> bool:
    return (outside / "precious").read_bytes() == b"p" * 1000


@pytest.fixture
def immutable() -> Iterator[Callable[[Path], None]]:
    """Make a file that even root cannot remove (chattr +i), undone after the test."""
    with immutable_files() as make:
        yield make


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """`fn()`, which must return (or raise) within `seconds` (a FIFO opened for reading would
    block)."""
    out: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 -- raised again in the caller
            failed.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if failed:
        raise failed[0]
    assert out, f"did not return within {seconds}s"
    return out[0]


# ---- the removal every cache uses ---------------------------------------------------------
def test_a_link_is_removed_as_a_link_and_its_target_stays(tmp_path: Path, outside: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(outside)
    done = cache_files.remove(link)
    assert done.whole and done.what == "a symlink" and done.freed == 0
    assert not link.is_symlink() and untouched(outside)
    assert "removed the symlink" in done.text() and str(outside) in done.text()


def test_a_folder_goes_with_what_it_holds_links_inside_as_links(tmp_path: Path,
                                                                outside: Path) -> None:
    folder = tmp_path / "f"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a").write_bytes(b"x" * 300)
    (folder / "out").symlink_to(outside)
    (folder / "out-file").symlink_to(outside / "precious")
    os.mkfifo(folder / "pipe")
    done = cache_files.remove(folder)
    assert done.whole and done.freed == 300 and not folder.exists() and untouched(outside)
    assert done.text() == f"removed {folder} (300B)"


@pytest.mark.parametrize("make", ["fifo", "file"])
def test_a_fifo_or_a_file_goes_as_a_file(tmp_path: Path, make: str) -> None:
    path = tmp_path / "x"
    if make == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(b"12345")
    done = within(5, lambda: cache_files.remove(path))
    assert done.whole and not path.exists()
    assert done.what == ("a FIFO" if make == "fifo" else "a file")


def test_what_cannot_be_removed_is_said_with_what_was(tmp_path: Path,
                                                      immutable: Callable[[Path], None]) -> None:
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "gone").write_bytes(b"g" * 100)
    (folder / "stays").write_bytes(b"s" * 10)
    immutable(folder / "stays")
    done = cache_files.remove(folder)
    assert done.found and not done.whole and done.freed == 100
    assert (folder / "stays").exists() and not (folder / "gone").exists()
    text = done.text()
    assert text.startswith(f"removed 100B of {folder}; could not remove ") and \
        "Operation not permitted" in text, text


def test_only_regular_files_are_read_and_never_a_fifo_waited_on(tmp_path: Path,
                                                                outside: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "link").symlink_to(outside / "precious")
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("ok")
    for name, said in (("pipe", "a FIFO"), ("link", "a symlink"), ("dir", "a folder")):
        with pytest.raises(OSError, match=said):
            within(5, lambda n=name: cache_files.read_regular(tmp_path / n))  # type: ignore[misc]
    assert cache_files.read_regular(tmp_path / "file") == b"ok"


# ---- the hub cache ---------------------------------------------------------------------------
def test_a_linked_repository_is_listed_not_followed_and_removed_as_a_link(
        tmp_path: Path, outside: Path) -> None:
    cache = tmp_path / "hub"
    cache.mkdir()
    (outside / "refs").mkdir()
    (outside / "refs" / "main").write_text(COMMIT)
    (outside / "blobs").mkdir()
    (outside / "blobs" / "b").write_bytes(b"w" * 5000)
    (cache / REF.folder).symlink_to(outside)
    (entry,) = hc.entries(cache)
    assert (entry.repo, entry.size, entry.revisions) == ("org/tiny", 0, {})
    assert "is a symlink to" in entry.problem and "exoctl rm hf:org/tiny" in entry.problem
    assert hc.cached(cache, REF) is None
    assert hc.repo_problem(cache, REF) == entry.problem
    done = hc.remove(cache, REF)
    assert done.whole and done.what == "a symlink" and not (cache / REF.folder).is_symlink()
    assert untouched(outside) and (outside / "blobs" / "b").exists()


def test_a_linked_folder_inside_a_repository_is_not_followed(tmp_path: Path,
                                                             outside: Path) -> None:
    cache = tmp_path / "hub"
    repo = hc.repo_dir(cache, REF)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "blobs").symlink_to(outside)
    assert "blobs is a symlink to" in (hc.repo_problem(cache, REF) or "")
    assert hc.cached(cache, REF) is None
    done = hc.remove(cache, REF)
    assert done.whole and not repo.exists() and untouched(outside)


def test_a_fifo_a_folder_or_a_file_where_the_cache_expects_another_kind(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    repo = hc.repo_dir(cache, REF)
    (repo / "refs").mkdir(parents=True)
    os.mkfifo(repo / "refs" / "main")  # read as a ref, it would block the daemon's loop
    assert within(5, lambda: hc.commit_of(cache, REF)) is None
    (entry,) = within(5, lambda: hc.entries(cache))
    assert entry.revisions == {} and entry.problem == ""
    (repo / "refs" / "main").unlink()
    (repo / "refs" / "main").mkdir()  # a folder where the ref's file should be
    assert hc.commit_of(cache, REF) is None and hc.cached(cache, REF) is None
    pinned = HubRef("org/tiny", COMMIT)
    hc.manifest_path(cache, pinned, COMMIT).mkdir(parents=True)  # a folder for the record
    assert hc.read_manifest(cache, pinned, COMMIT) is None and hc.cached(cache, pinned) is None
    shutil.rmtree(repo)
    repo.write_text("not a folder")  # a file where the repository's folder should be
    (entry,) = hc.entries(cache)
    assert "is a file, not a folder" in entry.problem
    done = hc.remove(cache, REF)
    assert done.whole and done.what == "a file" and not repo.exists()
    os.mkfifo(repo)
    assert "is a FIFO, not a folder" in within(5, lambda: hc.entries(cache))[0].problem
    assert within(5, lambda: hc.remove(cache, REF)).whole


def test_the_fetcher_refuses_a_linked_repository(tmp_path: Path, outside: Path) -> None:
    from exod.hub import fetch

    cache = tmp_path / "hub"
    cache.mkdir()
    (cache / REF.folder).symlink_to(outside)
    job = fetch.FetchJob(REF, cache, offline=True, token=False, commit=None,
                    link=None)  # type: ignore[arg-type]
    with pytest.raises(fetch.FetchRefused, match="is a symlink to .*exod neither reads nor writes"):
        fetch.plan(job)
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]


def test_a_repository_that_cannot_be_removed_says_what_was(
        tmp_path: Path, immutable: Callable[[Path], None]) -> None:
    cache = tmp_path / "hub"
    repo = hc.repo_dir(cache, REF)
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "a").write_bytes(b"a" * 10)
    (repo / "blobs" / "b").write_bytes(b"b" * 10)
    immutable(repo / "blobs" / "b")
    done = hc.remove(cache, REF)
    assert done.found and not done.whole and (repo / "blobs" / "b").exists()
    assert "could not remove" in done.text() and "blobs/b" in done.text()


# ---- the prompt cache: a runner opening its folder -----------------------------------------
def model_dir(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text('{"model_type": "llama"}')
    (root / "model.safetensors").write_bytes(b"weights")
    return root


def opened(root: Path, model: Path, parts: dict[str, object] | None = None) -> DiskTier:
    tier = DiskTier(root, 0, 1 << 20)
    tier.open(parts or {"format": fp.FORMAT_VERSION}, fp.weight_files(model, None))
    assert tier.writer.drain(time.monotonic() + 30), "the tier did not open"
    return tier


def said(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_a_linked_stale_folder_goes_as_a_link_and_the_log_says_so(
        tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = model_dir(tmp_path / "m")
    root = tmp_path / "pc"
    first = opened(root, model)
    (root / "rank0" / ("e" * 32)).symlink_to(outside)  # named as another fingerprint's
    (root / "rank0" / ("d" * 32)).mkdir()
    (root / "rank0" / ("d" * 32) / "x.safetensors").write_bytes(b"x" * (1 << 20))
    os.mkfifo(root / "rank0" / ("f" * 32))
    said(capsys)
    again = within(30, lambda: opened(root, model))
    assert again.ready and again.folder == first.folder and untouched(outside)
    assert sorted(p.name for p in (root / "rank0").iterdir()) == [first.fingerprint]
    lines = said(capsys)
    assert any("removed 1.0 MiB in 1 folder kept for other weights or settings" in x
               for x in lines), lines
    link = next(x for x in lines if "removed the symlink" in x)
    assert str(outside) in link and "not followed" in link
    assert any("(a FIFO)" in x for x in lines), lines


def test_a_link_or_a_file_where_the_tiers_folders_should_be(
        tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = model_dir(tmp_path / "m")
    root = tmp_path / "pc"
    root.mkdir()
    (root / "rank0").symlink_to(outside)  # a rank's folder out of the cache
    tier = opened(root, model)
    assert tier.ready and not (root / "rank0").is_symlink() and untouched(outside)
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]
    assert any("was a symlink to" in x and "removed the symlink" in x for x in said(capsys))
    shutil.rmtree(root)
    root.write_text("a file where the instance's folder should be")
    assert opened(root, model).ready and root.is_dir()
    assert any("was a file, not a folder: removed" in x for x in said(capsys))
    fingerprint = opened(root, model).folder
    assert fingerprint is not None
    shutil.rmtree(fingerprint)
    fingerprint.symlink_to(outside)  # its own fingerprint's folder, out of the cache
    tier = opened(root, model)
    assert tier.ready and fingerprint.is_dir() and not fingerprint.is_symlink()
    assert untouched(outside)


def test_strange_entries_and_records_are_misses_never_followed_nor_waited_on(
        tmp_path: Path, outside: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = model_dir(tmp_path / "m")
    root = tmp_path / "pc"
    folder = opened(root, model).folder
    assert folder is not None
    (folder / ("1" * 32 + ".safetensors")).symlink_to(outside / "precious")
    os.mkfifo(folder / ("2" * 32 + ".safetensors"))
    (root / "weights.json").unlink(missing_ok=True)
    os.mkfifo(root / "weights.json")  # the weights' hashes: a FIFO would hold the opening
    (model / fp.RECORD).unlink(missing_ok=True)
    os.mkfifo(model / fp.RECORD)
    said(capsys)
    tier = within(30, lambda: opened(root, model))
    assert tier.ready and len(tier.index) == 0 and untouched(outside)
    assert sorted(p.name for p in folder.iterdir()) == []
    lines = [x for x in said(capsys) if "prompt cache on disk: cannot read" in x]
    assert len(lines) == 2 and any("a symlink to" in x and "not followed" in x for x in lines)


def test_a_stale_folder_that_cannot_be_removed_is_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        immutable: Callable[[Path], None]) -> None:
    model = model_dir(tmp_path / "m")
    root = tmp_path / "pc"
    opened(root, model)
    stale = root / "rank0" / ("e" * 32)
    stale.mkdir()
    (stale / "x.safetensors").write_bytes(b"x" * 10)
    immutable(stale / "x.safetensors")
    said(capsys)
    assert opened(root, model).ready
    lines = said(capsys)
    assert not any("MiB in" in x for x in lines), lines  # nothing said removed that was not
    assert any("could not remove" in x and "Operation not permitted" in x for x in lines), lines


# ---- the daemon's `exoctl cache clear` of a stopped instance ----------------------------------
def test_clearing_a_folder_with_links_removes_the_links_only(tmp_path: Path,
                                                             outside: Path) -> None:
    from exod.daemon.cache_commands import empty

    folder = tmp_path / "pc" / "t"
    (folder / "rank0" / "f").mkdir(parents=True)
    (folder / "rank0" / "f" / "e.safetensors").write_bytes(b"x" * 10)
    (folder / "rank1").symlink_to(outside)
    freed, notes = empty(folder)
    assert freed == 10 and untouched(outside) and list(folder.iterdir()) == []
    assert len(notes) == 1 and "removed the symlink" in notes[0] and str(outside) in notes[0]
    folder.rmdir()
    folder.symlink_to(outside)  # the instance's folder itself
    freed, notes = empty(folder)
    assert freed == 0 and not folder.is_symlink() and untouched(outside)
    assert "removed the symlink" in notes[0]


def test_clearing_says_what_it_could_not_remove(tmp_path: Path,
                                                immutable: Callable[[Path], None]) -> None:
    from exod.daemon.cache_commands import empty

    folder = tmp_path / "t"
    (folder / "rank0" / "f").mkdir(parents=True)
    (folder / "rank0" / "f" / "a.safetensors").write_bytes(b"a" * 10)
    (folder / "rank0" / "f" / "b.safetensors").write_bytes(b"b" * 10)
    immutable(folder / "rank0" / "f" / "b.safetensors")
    freed, notes = empty(folder)
    assert freed == 10 and len(notes) == 1 and "could not remove" in notes[0], notes
