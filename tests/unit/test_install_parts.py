"""The pure parts of installing, upgrading, removing and checking an installed exod: version
stamps, the service manager's commands, what the service's user can reach through the sandbox,
and where exoctl looks for a daemon."""

from __future__ import annotations

import os
import socket
import stat
from importlib.metadata import version
from pathlib import Path

import pytest

from exod import __version__, paths
from exod.service_files import checks, files, steps, system_check
from exod.service_files.access import Identity, access_problem, hidden_by, reach_problem
from exod.service_files.install import Planned
from exod.service_files.stamp import older, read_stamp, stamped

EXOD = Identity("exod", 990, frozenset({990}))


def test_version_comes_from_the_package_metadata() -> None:
    assert __version__ == version("exod")


def test_stamps_round_trip_and_order() -> None:
    unit = stamped("[Service]\nType=notify\n", "unit")
    assert unit.startswith("# installed by exod ") and read_stamp(unit) == __version__
    plist = stamped('<?xml version="1.0"?>\n<plist/>\n', "plist")
    assert plist.splitlines()[1].startswith("<!-- installed by exod ")
    assert read_stamp(plist) == __version__ and read_stamp("[Service]\n") is None
    assert older("0.0.9", "0.1.0") and older("0.9.1", "0.10.0")
    assert not older("0.1.0", "0.1.0") and not older("0.2.0", "0.1.0")


def test_check_warns_about_a_unit_from_an_older_exod(tmp_path: Path) -> None:
    unit = tmp_path / "exod.service"
    unit.write_text("# installed by exod 0.0.1 (`exod install`)\n[Service]\n")
    [warning] = checks.check_stamp(unit)
    assert f"installed by exod 0.0.1, older than this exod {__version__}" in warning
    unit.write_text(stamped("[Service]\n", "unit"))
    assert checks.check_stamp(unit) == []
    unit.write_text("[Service]\n")  # a distribution's own unit: no stamp, no opinion
    assert checks.check_stamp(unit) == []


def test_remove_keeps_other_drop_ins_and_is_idempotent(tmp_path: Path) -> None:
    unit = tmp_path / "exod.service"
    ours = tmp_path / "exod.service.d/exod-install-home.conf"
    theirs = tmp_path / "exod.service.d/operator.conf"
    files.write([Planned(unit, "u"), Planned(ours, "o"), Planned(theirs, "t")])
    changes = files.remove([unit, ours])
    assert [(c.path, c.what) for c in changes] == [(unit, "removed"), (ours, "removed")]
    assert theirs.exists()
    theirs.unlink()
    files.write([Planned(ours, "o")])
    assert [c.path for c in files.remove([unit, ours])] == [ours, ours.parent]
    assert files.remove([unit, ours]) == []


def test_systemd_commands_in_order(tmp_path: Path) -> None:
    system, user = steps.Target("systemd", False), steps.Target("systemd", True)
    sysusers = Path("/etc/sysusers.d/exod.conf")
    assert steps.after_install(system, True, sysusers) == [
        ["systemd-sysusers", str(sysusers)], ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "exod.service"]]
    assert steps.after_install(user, False, None) == [
        ["systemctl", "--user", "enable", "exod.service"]]
    assert steps.before_uninstall(user) == [
        ["systemctl", "--user", "disable", "--now", "exod.service"]]
    assert steps.after_uninstall(system)[0] == ["systemctl", "daemon-reload"]
    running = steps.next_steps(system, Path("/etc/exod/exod.yaml"), tmp_path, True, True)
    assert any("restart exod" in line and "reload" in line for line in running), running
    lines = steps.next_steps(user, Path("/home/u/.config/exod/exod.yaml"), tmp_path, False, True)
    assert "systemctl --user start exod" in lines[1]


def _st(mode: int, uid: int = 0, gid: int = 0) -> os.stat_result:
    return os.stat_result((mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))


def test_access_walks_every_folder_with_the_users_bits() -> None:
    tree = {"/": _st(stat.S_IFDIR | 0o755), "/srv": _st(stat.S_IFDIR | 0o750),
            "/srv/m": _st(stat.S_IFDIR | 0o755), "/srv/m/w": _st(stat.S_IFREG | 0o640, 0, 990)}
    look = tree.__getitem__
    why, fix = access_problem(Path("/srv/m"), EXOD, look) or ("", "")
    assert "/srv (mode 0750) is not searchable by exod" in why and "setfacl" in fix
    tree["/srv"] = _st(stat.S_IFDIR | 0o750, 0, 990)  # group exod may enter
    assert access_problem(Path("/srv/m"), EXOD, look) is None
    assert access_problem(Path("/srv/m/w"), EXOD, look) is None  # group read
    tree["/srv/m/w"] = _st(stat.S_IFREG | 0o600)
    why, fix = access_problem(Path("/srv/m/w"), EXOD, look) or ("", "")
    assert "file /srv/m/w (mode 0600) is not readable by exod" in why
    assert fix == "sudo chgrp exod /srv/m/w && sudo chmod g+r /srv/m/w"
    assert access_problem(Path("/srv/m/w"), Identity("root", 0, frozenset({0})), look) is None


def test_the_sandbox_hides_homes_and_tmp_but_not_what_it_binds() -> None:
    svc = {"ProtectHome": "tmpfs", "BindReadOnlyPaths": "/root/.pyenv/versions/3.11.7",
           "PrivateTmp": "yes"}
    assert hidden_by("/home/u/models/x", svc) == "ProtectHome=tmpfs"
    assert hidden_by("/root/.pyenv/versions/3.11.7/bin/python3.11", svc) is None
    assert hidden_by("/tmp/model", svc) == "PrivateTmp=yes"
    assert hidden_by("/srv/models", svc) is None
    assert hidden_by("/home/u/m", {"ProtectHome": "read-only"}) is None
    # Above a bound folder the sandbox makes its own folders: /root's 0700 does not matter.
    tree = {"/root/.pyenv/versions/3.11.7": _st(stat.S_IFDIR | 0o755),
            "/root/.pyenv/versions/3.11.7/bin": _st(stat.S_IFDIR | 0o755),
            "/root/.pyenv/versions/3.11.7/bin/python3.11": _st(stat.S_IFREG | 0o755)}
    target = Path("/root/.pyenv/versions/3.11.7/bin/python3.11")
    assert reach_problem(target, EXOD, svc, tree.__getitem__) is None
    why, _ = reach_problem(Path("/home/u/m"), EXOD, svc, tree.__getitem__) or ("", "")
    assert why == "/home/u/m is hidden from the service by ProtectHome=tmpfs"


def test_port_problem_names_a_taken_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        problem = system_check.port_problem(f"127.0.0.1:{port}")
        assert problem is not None and f"127.0.0.1:{port} cannot be bound" in problem.what
        assert "fix: free it" in problem.line()
    assert system_check.port_problem("") is None


def test_config_path_from_exec_start() -> None:
    svc = {"ExecStart": "/opt/exod/bin/exod run -c /etc/exod/exod.yaml"}
    assert system_check.config_path(svc) == Path("/etc/exod/exod.yaml")
    assert system_check.config_path({"ExecStart": "/x/exod run"}) is None


def test_exoctl_finds_a_user_service_when_no_system_daemon_is_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    user_sock = tmp_path / "exod" / "control.sock"
    cands = paths.client_socket_candidates()
    assert user_sock in cands and paths.SYSTEM_RUNTIME_DIR / "control.sock" in cands
    if os.geteuid() == 0:
        assert cands[0] == paths.SYSTEM_RUNTIME_DIR / "control.sock"
    user_sock.parent.mkdir()
    user_sock.touch()
    if not (paths.SYSTEM_RUNTIME_DIR / "control.sock").exists():
        assert paths.client_socket() == user_sock
