"""Every folder exod makes has its documented mode whatever the umask (docs/service.md, "Folders
and their modes"): each place that makes one, run under umask 022, 000 and 077, with every folder
it made checked, its missing parents included; a folder that was there is left as it was. And
`exod check` names a folder of exod's that is wider than its mode."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exod import paths
from exod.config.schema import Instance
from exod.daemon.cache_owner import CacheOwner
from exod.hub import cache as hc
from exod.core.hub_ref import HubRef
from exod.models._io import STAMP_NAME
from tests.unit.test_memory import model as tiny_model

UMASKS = [0o022, 0o000, 0o077]
COMMIT = "a" * 40


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


@pytest.fixture(params=UMASKS, ids=lambda u: f"umask{u:03o}")
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    before = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(before)


def made_below(top: Path, before: set[Path]) -> dict[Path, int]:
    """Every folder under `top` (itself included) that was not in `before`, with its mode."""
    found = {top} if top.is_dir() else set()
    for root, dirs, _files in os.walk(top):
        found.update(Path(root) / d for d in dirs)
    return {p: mode(p) for p in sorted(found - before)}


def folders_made(tmp_path: Path, action: Callable[[], object]) -> dict[Path, int]:
    before = {Path(r) / d for r, ds, _ in os.walk(tmp_path) for d in ds} | {tmp_path}
    action()
    return made_below(tmp_path, before)


def test_make_dirs_gives_each_missing_folder_its_mode_and_leaves_the_rest(
        tmp_path: Path, umask: int) -> None:
    there = tmp_path / "there"
    there.mkdir()
    there.chmod(0o751)  # someone else's: kept as it is
    made = paths.make_dirs(there / "a" / "b" / "c", 0o700)
    assert made == [there / "a", there / "a" / "b", there / "a" / "b" / "c"]
    assert {mode(p) for p in made} == {0o700} and mode(there) == 0o751
    assert paths.make_dirs(there / "a" / "b" / "c", 0o755) == []  # there: left as it is
    assert mode(there / "a" / "b" / "c") == 0o700
    (there / "file").write_text("")
    with pytest.raises(FileExistsError):
        paths.make_dirs(there / "file", 0o700)
    with pytest.raises(FileExistsError):  # a file where a parent should be
        paths.make_dirs(there / "file" / "below", 0o700)
    (there / "link").symlink_to(there / "a")  # a link to a folder leads on, as a path may
    assert paths.make_dirs(there / "link" / "d", 0o700) == [there / "link" / "d"]
    assert mode(there / "a" / "d") == 0o700


def test_a_umask_that_takes_everything_still_gives_the_mode(tmp_path: Path) -> None:
    before = os.umask(0o777)
    try:
        made = paths.make_dirs(tmp_path / "x" / "y", 0o700)
    finally:
        os.umask(before)
    assert [mode(p) for p in made] == [0o700, 0o700]


def test_the_prompt_cache_folders(tmp_path: Path, umask: int) -> None:
    from exod.runner.prompt_cache import fingerprint as fp
    from exod.runner.prompt_cache.disk import DiskTier

    model = tmp_path / "model"
    model.mkdir(mode=0o755)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w")
    config = tmp_path / "exod.yaml"
    inst = Instance(name="t", model=model, prompt_cache_dir=tmp_path / "var" / "pc")

    def both() -> None:
        owner = CacheOwner(config, {})
        owner.claim([inst])  # the daemon: DIR/ID, locked
        folder = owner.folder(inst)
        assert folder is not None
        tier = DiskTier(folder, 0, 1 << 20)  # a runner: DIR/ID/NAME/rank0/FINGERPRINT
        tier.open({"format": fp.FORMAT_VERSION}, fp.weight_files(model, None))
        assert tier.writer.drain(time.monotonic() + 30) and tier.ready, tier.state

    made = folders_made(tmp_path, both)
    base = tmp_path / "var" / "pc" / paths.daemon_id(config)
    assert {base.parent.parent, base.parent, base, base / "t", base / "t" / "rank0"} < set(made)
    assert len(made) == 6 and set(made.values()) == {0o700}, made


def test_the_hub_cache_folders(tmp_path: Path, umask: int) -> None:
    from exod.hub import fetch

    ref = HubRef("org/tiny")
    cache = tmp_path / "home" / ".cache" / "huggingface" / "hub"

    def fetched() -> None:
        hc.write_manifest(cache, ref, hc.Manifest(COMMIT, {}))
        hc.write_ref(cache, ref, COMMIT)
        blob = hc.repo_dir(cache, ref) / "blobs" / "b"
        fetch.make_dirs(blob.parent, paths.READABLE)  # as fetch_file makes them
        fetch.make_dirs(hc.snapshot_dir(cache, ref, COMMIT), paths.READABLE)

    made = folders_made(tmp_path, fetched)
    repo = hc.repo_dir(cache, ref)
    assert {repo / n for n in ("blobs", "refs", "snapshots", "exod")} < set(made)
    assert cache.parent.parent in made  # ~/.cache, missing: made too
    assert set(made.values()) == {0o755}, made


def test_the_state_cache_and_helper_folders(tmp_path: Path, umask: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from exod.api.seal import load_key
    from exod.facts import probe
    from exod.models._io import build_atomically
    from exod.runner.start import import_table
    from exod.wire.specs import Verdict

    from exod.child_start import helper_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg" / "cache"))
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)

    def made() -> None:
        assert helper_dir() == tmp_path / "xdg" / "cache" / "exod"
        load_key(tmp_path / "state" / "exod" / "reasoning.key")
        own = tmp_path / "cache" / "exod"
        probe._write(own / "probe" / "k.json", Verdict(True, None, None, None))
        import_table._write(own / "imports" / "t.json", {})
        build_atomically(own / "demo" / "model", {"v": 1},
                         lambda staging: (staging / "config.json").touch())

    found = folders_made(tmp_path, made)
    modes = {p.relative_to(tmp_path).as_posix(): m for p, m in found.items()}
    models = {"cache/exod/demo", "cache/exod/demo/model"}  # a prepared model: readable
    assert {"state", "state/exod", "cache/exod/probe", "cache/exod/imports", "xdg", "xdg/cache",
            "xdg/cache/exod", *models} <= set(modes), modes
    assert {m for p, m in modes.items() if p not in models} == {0o700}, modes
    assert {modes[p] for p in models} == {0o755}, modes


def test_the_service_files_and_the_runtime_folder(tmp_path: Path, umask: int) -> None:
    from exod import trust
    from exod.service_files.files import write
    from exod.service_files.install import PlannedFile

    def made() -> None:
        write([PlannedFile(tmp_path / "etc" / "exod" / "exod.yaml", "x: 1\n", 0o600),
               PlannedFile(tmp_path / "Library" / "Logs" / "exod", "", 0o755, folder=True)])
        trust.ensure_private_dir(tmp_path / "run" / "user" / "exod", group_access=False)

    found = folders_made(tmp_path, made)
    want = {"etc": 0o755, "etc/exod": 0o755, "Library": 0o755, "Library/Logs": 0o755,
            "Library/Logs/exod": 0o755, "run": 0o755, "run/user": 0o755,
            "run/user/exod": 0o700}
    assert {p.relative_to(tmp_path).as_posix(): m for p, m in found.items()} == want


def test_the_kernel_header_folder(tmp_path: Path, umask: int,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """mlx's kernel cache under $TMPDIR, when the header is built there first."""
    from exod.runner.cpu import jit_header

    monkeypatch.setattr(jit_header.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(
        OSError("no compiler here")))
    target = tmp_path / "mlx" / "0.0" / "cpu" / "h.gch"
    found = folders_made(tmp_path, lambda: _quiet(jit_header._build, tmp_path, target))
    assert set(found) == {tmp_path / "mlx", tmp_path / "mlx" / "0.0", target.parent}
    assert set(found.values()) == {0o700}


def _quiet(fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except OSError:
        pass


# ---- exod check -------------------------------------------------------------------------
def test_exod_check_names_each_folder_wider_than_its_mode(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from exod.cli.exod import main

    for var in ("STATE_DIRECTORY", "CACHE_DIRECTORY", "RUNTIME_DIRECTORY", "HF_HUB_CACHE",
                "HF_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    model = tmp_path / "m"
    model.mkdir()
    tiny_model(model)
    cfg = tmp_path / "exod.yaml"
    cfg.write_text(f"control: {{socket: {tmp_path}/run/c.sock}}\n"
                   f"hub: {{cache: {tmp_path}/hub, offline: true}}\n"
                   f"defaults: {{prompt_cache_dir: {tmp_path}/pc}}\n"
                   f"instances:\n  t: {{model: {model}}}\n"
                   f"  h: {{model: 'hf:org/tiny', autostart: false}}\n")

    def check() -> list[str]:
        out = CliRunner().invoke(main, ["check", "-c", str(cfg)])
        assert out.exit_code == 0, out.output
        return [ln for ln in out.output.splitlines() if "wider than" in ln]

    assert check() == []  # nothing there yet: nothing to say
    base = tmp_path / "pc" / paths.daemon_id(cfg)
    rank = base / "t" / "rank0" / ("f" * 32)
    paths.make_dirs(rank, 0o700)
    paths.make_dirs(tmp_path / "xdg-state" / "exod", 0o700)
    paths.make_dirs(tmp_path / "xdg-cache" / "exod" / "probe", 0o700)
    paths.make_dirs(tmp_path / "run", 0o700)
    repo = hc.repo_dir(tmp_path / "hub", HubRef("org/tiny"))
    paths.make_dirs(repo / "blobs", 0o755)
    demo = tmp_path / "xdg-cache" / "exod" / "demo-model"  # a prepared model: readable
    paths.make_dirs(demo, 0o755)
    (demo / STAMP_NAME).write_text("{}")
    assert check() == []  # each as exod makes it
    for folder, wide in ((rank, 0o755), (base, 0o750), (tmp_path / "xdg-state" / "exod", 0o755),
                         (tmp_path / "xdg-cache" / "exod" / "probe", 0o711),
                         (tmp_path / "run", 0o755), (repo / "blobs", 0o777)):
        folder.chmod(wide)
    (tmp_path / "pc").chmod(0o777)  # a prompt_cache_dir of the operator's: not exod's to judge
    said = check()
    want = {rank: "chmod 700", base: "chmod 700", tmp_path / "xdg-state" / "exod": "chmod 700",
            tmp_path / "xdg-cache" / "exod" / "probe": "chmod 700",
            tmp_path / "run": "chmod 700", repo / "blobs": "chmod 755"}
    assert len(said) == len(want), said
    for folder, fix in want.items():
        line = next(ln for ln in said if f" {folder} is mode " in ln)
        assert line.startswith("warning: ") and line.endswith(f"{fix} {folder}"), line



def test_exod_check_names_the_prompt_cache_of_an_older_exod(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from exod.cli.exod import main

    model = tmp_path / "m"
    model.mkdir()
    tiny_model(model)
    cfg = tmp_path / "exod.yaml"
    cfg.write_text(f"control: {{socket: {tmp_path}/run/c.sock}}\n"
                   f"defaults: {{prompt_cache_dir: {tmp_path}/pc}}\n"
                   f"instances:\n  t: {{model: {model}}}\n")
    (tmp_path / "pc" / "t" / "rank0" / ("f" * 32)).mkdir(parents=True)  # DIR/NAME, as before
    out = CliRunner().invoke(main, ["check", "-c", str(cfg)])
    mine = tmp_path / "pc" / paths.daemon_id(cfg) / "t"
    assert f"warning: {tmp_path}/pc/t holds the prompt cache of an older exod, which nothing " \
           f"reads now (this one keeps t's in {mine}): remove it" in out.output, out.output
def test_exod_check_never_asks_to_narrow_a_shared_sticky_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A control socket (or the prompt cache's base) in a folder such as /tmp: mode 1777 is
    that folder's own, which exod never made; `chmod 700 /tmp` would break the host."""
    from click.testing import CliRunner

    from exod.cli.exod import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    model = tmp_path / "m"
    model.mkdir()
    tiny_model(model)
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    cfg = tmp_path / "exod.yaml"
    cfg.write_text(f"control: {{socket: {shared}/c.sock}}\n"
                   f"instances:\n  t: {{model: {model}}}\n")
    out = CliRunner().invoke(main, ["check", "-c", str(cfg)])
    assert out.exit_code == 0, out.output
    assert f"{tmp_path}" in out.output  # the check ran on this config
    assert "wider than" not in out.output, out.output
    shared.chmod(0o777)  # the same folder, not sticky: a folder exod would make 0700
    out = CliRunner().invoke(main, ["check", "-c", str(cfg)])
    assert f"warning: {shared} is mode 0777" in out.output, out.output
