"""A daemon's own folder in a shared prompt_cache_dir (exod.daemon.cache_owner): named by its
config file's path, locked while it runs; a second daemon of the same config finds it busy and
keeps no disk tier there, and never touches the first one's. Two real daemons sharing a folder,
and a second one of the same config in a process of its own:
tests/integration/test_strange_cache.py."""

from __future__ import annotations

import os
from pathlib import Path

from exod import paths
from exod.config.schema import Instance
from exod.daemon.cache_owner import LOCK, CacheOwner
from exod.daemon.cache_commands import clear
from tests.immutable import immutable_files


def inst(tmp_path: Path, name: str = "t", **kw: object) -> Instance:
    return Instance(name=name, model=tmp_path, prompt_cache_dir=tmp_path / "shared", **kw)  # type: ignore[arg-type]


def test_each_config_has_its_own_folder_named_the_same_after_a_restart(tmp_path: Path) -> None:
    a, b = CacheOwner(tmp_path / "a.yaml", {}), CacheOwner(tmp_path / "b.yaml", {})
    t = inst(tmp_path)
    a.claim([t])
    b.claim([t])
    fa, fb = a.folder(t), b.folder(t)
    assert fa is not None and fb is not None and fa != fb
    assert fa == tmp_path / "shared" / paths.daemon_id(tmp_path / "a.yaml") / "t"
    assert fa == CacheOwner(tmp_path / "a.yaml", {}).folder(t)  # no claim needed to name it
    lock = (fa.parent / LOCK).read_text()
    assert lock == f"pid {os.getpid()}, config {tmp_path / 'a.yaml'}\n"
    assert paths.daemon_id(Path("x.yaml")) == paths.daemon_id(Path.cwd() / "x.yaml")


def test_a_second_daemon_of_the_same_config_keeps_no_disk_tier_there(tmp_path: Path) -> None:
    """The lock is the kernel's (flock): a second open of the file conflicts with the first, in
    another process as in this one."""
    config = tmp_path / "exod.yaml"
    t = inst(tmp_path)
    first, second = CacheOwner(config, {}), CacheOwner(config, {})
    first.claim([t])
    second.claim([t, inst(tmp_path, "off", prompt_cache_disk_bytes=0)])
    assert first.folder(t) is not None and second.folder(t) is None
    assert f"pid {os.getpid()}, config {config}" in (second.busy(t) or "")
    mine = first.folder(t)
    assert mine is not None
    (mine / "rank0").mkdir(parents=True)
    (mine / "rank0" / "entry").write_text("the first daemon's")

    class Stopped:  # an instance of the second daemon with no runner alive
        name = "t"
        ranks: list[object] = []

        def serving_link(self) -> None:
            return None

    reply = clear([Stopped()], lambda i: second.folder(t))  # type: ignore[list-item]
    assert reply.cleared[0].how == "none" and (mine / "rank0" / "entry").exists()
    os.close(first._held.pop(mine.parent))  # the first daemon exits
    second.claim([t])  # at its next reload: its own now
    assert second.folder(t) == mine and second.busy(t) is None


def test_a_link_in_place_of_the_daemons_folder_is_removed_as_a_link(tmp_path: Path) -> None:
    config = tmp_path / "exod.yaml"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("k")
    base = tmp_path / "shared" / paths.daemon_id(config)
    base.parent.mkdir()
    base.symlink_to(elsewhere)
    owner = CacheOwner(config, {})
    owner.claim([inst(tmp_path)])
    assert base.is_dir() and not base.is_symlink() and (base / LOCK).exists()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep"]


def test_a_link_that_cannot_be_removed_leaves_no_disk_tier_there(tmp_path: Path) -> None:
    config = tmp_path / "exod.yaml"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    base = tmp_path / "shared" / paths.daemon_id(config)
    base.parent.mkdir()
    base.symlink_to(elsewhere)
    t = inst(tmp_path)
    with immutable_files() as make:
        make(base.parent)  # nothing in it can be removed: the link stays
        owner = CacheOwner(config, {})
        owner.claim([t])
        assert owner.folder(t) is None and base.is_symlink()
        assert "is a symlink to" in (owner.busy(t) or "") and list(elsewhere.iterdir()) == []
