"""How exod starts its Python children (exod.child_start), as each launcher builds it: a runner
or a fetcher (exod.daemon.spawn), the zygote (exod.daemon.zygote), the split probe (exod.wire.ask)
and the demo converter (exod.cli.demo) get safe-path mode, the bootstrap that changes to a
folder exod owns, and an explicit PYTHONPATH that keeps its meaning. posix_spawn and
subprocess are replaced by recorders: no process starts here (tests/integration/
test_import_path.py starts real ones)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from exod.wire import ask as asking
from exod import child_start
from exod.wire import messages as m
from exod.child_start import BOOT, explicit_path, python_argv
from exod.cli import demo
from exod.config.schema import Instance
from exod.core.shards import Shard
from exod.daemon import spawn, zygote
from exod.daemon.launch import Launcher, fetcher_launch
from exod.core.hub_ref import HubRef
from exod.wire.specs import Layout, ProbeAnswer, ProbeAsk

SAFE = ["-P"] if sys.version_info >= (3, 11) else []


def started_in(argv: list[str], folder: Path, module: str, *args: str) -> None:
    """`argv` runs `module args` in `folder` in safe-path mode, never by `-m`."""
    assert argv == [sys.executable, *SAFE, "-c", BOOT, str(folder), module, *args]


def test_the_command_line_runs_the_module_in_the_folder_in_safe_path_mode(tmp_path: Path
                                                                          ) -> None:
    started_in(python_argv("exod.runner", ["--channel-fd", "7"], tmp_path), tmp_path,
               "exod.runner", "--channel-fd", "7")
    code = compile(BOOT, "<boot>", "exec")  # valid on every Python exod supports
    assert "runpy" in code.co_names and "chdir" in BOOT
    # Python 3.10's `-c` puts '' first: dropped before anything is imported.
    assert BOOT.index("del sys.path[0]") < BOOT.index("import os, runpy")


def test_an_explicit_pythonpath_keeps_its_meaning_and_an_empty_entry_goes() -> None:
    env = {"PATH": "/bin", "PYTHONPATH": f"src{os.pathsep}{os.pathsep}/opt/lib{os.pathsep}."}
    assert explicit_path(env, "/home/op") == {
        "PATH": "/bin", "PYTHONPATH": os.pathsep.join(["/home/op/src", "/opt/lib",
                                                       "/home/op/."])}
    assert explicit_path({"PATH": "/bin"}, "/x") == {"PATH": "/bin"}
    assert explicit_path({"PYTHONPATH": os.pathsep}, "/x") == {}  # nothing but the cwd
    assert explicit_path({"PYTHONPATH": ""}, "/x") == {}


def test_a_deleted_working_directory_drops_relative_entries(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    def gone() -> str:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(os, "getcwd", gone)
    assert explicit_path({"PYTHONPATH": f"src{os.pathsep}/opt"}) == {"PYTHONPATH": "/opt"}


def test_runners_and_fetchers_run_in_the_daemon_s_runtime_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    launcher = Launcher(run_dir, {"PYTHONPATH": "lib", "NOTIFY_SOCKET": "/n"})
    launch = launcher.launch(Instance(name="x", model=tmp_path), Shard(0, 1, 0, 4, 4), 1, 1)
    assert launch.cwd == run_dir
    assert launch.env["PYTHONPATH"] == str(tmp_path / "lib")
    assert "NOTIFY_SOCKET" not in launch.env
    assert launcher.env(None)["PYTHONPATH"] == str(tmp_path / "lib")  # the zygote's: same
    fetch = fetcher_launch(HubRef("org/m"), None, tmp_path / "hub", False, None,
                           {"PYTHONPATH": "lib"}, run_dir)
    assert fetch.cwd == run_dir and fetch.env["PYTHONPATH"] == str(tmp_path / "lib")


def test_spawn_execs_the_bootstrap_with_the_launch_s_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    def posix_spawn(path: str, argv: list[str], env: dict[str, str], **kw: Any) -> int:
        calls.append((path, argv, env, kw))
        return 4242

    monkeypatch.setattr(os, "posix_spawn", posix_spawn)
    child = spawn.spawn({"A": "1"}, "exod.hub", tmp_path)
    try:
        (path, argv, env, kw), = calls
        assert path == sys.executable and env == {"A": "1"} and kw["setpgroup"] == 0
        started_in(argv, tmp_path, "exod.hub", "--channel-fd", argv[-1])
        assert child.pid == 4242
    finally:
        child.channel.close()
        os.close(child.stdout)
        os.close(child.stderr)


def test_the_zygote_starts_in_the_runtime_folder(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def posix_spawn(path: str, argv: list[str], env: dict[str, str], **kw: Any) -> int:
        calls.append(argv)
        return 4242

    monkeypatch.setattr(os, "posix_spawn", posix_spawn)
    monkeypatch.setattr(zygote, "become_subreaper", lambda: True)
    loop = asyncio.new_event_loop()
    z = zygote.Zygote("exod.runner", {"A": "1"}, tmp_path)
    try:
        z.start(loop)
        (argv,) = calls
        started_in(argv, tmp_path, "exod.runner", "--zygote-fd", argv[-1])
    finally:
        z.close()
        loop.close()


class Refused(OSError):
    pass


def recorded_popen(monkeypatch: pytest.MonkeyPatch, target: Any, name: str
                   ) -> list[tuple[list[str], dict[str, Any]]]:
    calls: list[tuple[list[str], dict[str, Any]]] = []

    def record(argv: list[str], **kw: Any) -> Any:
        calls.append((argv, kw))
        if name == "run":
            return subprocess.CompletedProcess(argv, 0, "chatter\n/the/model\n")
        raise Refused("recorded, not started")

    monkeypatch.setattr(target, name, record)
    return calls


def test_the_probe_runs_in_exod_s_cache_folder(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.setenv("PYTHONPATH", "/abs")
    calls = recorded_popen(monkeypatch, asking.subprocess, "Popen")
    question = ProbeAsk(version=m.VERSION, layouts=[
        Layout(model=tmp_path, shards=2, parallelism="pipeline", layers=None)])
    with pytest.raises(asking.NoAnswer, match="cannot start"):
        asking.ask("exod.runner.split.probe", question, {ProbeAnswer.type: ProbeAnswer}, 5.0)
    (argv, kw), = calls
    folder = tmp_path / "xdg" / "exod"
    assert folder.is_dir() and kw["cwd"] == folder and kw["env"]["PYTHONPATH"] == "/abs"
    started_in(argv, folder, "exod.runner.split.probe", "--channel-fd", argv[-1])


def test_a_helper_runs_in_root_s_folder_where_exod_s_cannot_be_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(child_start.paths, "cache_dir", lambda: tmp_path / "file" / "exod")
    assert child_start.helper_dir() == Path("/")


def test_the_demo_converter_runs_in_its_cache_named_absolutely(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    calls = recorded_popen(monkeypatch, demo.subprocess, "run")
    assert demo.prepare_model(Path("cache")) == Path("/the/model")
    (argv, kw), = calls
    cache = tmp_path / "cache"
    assert cache.is_dir() and kw["cwd"] == cache
    started_in(argv, cache, "exod.models.demo", "--cache-dir", str(cache))
