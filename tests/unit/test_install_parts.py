"""The pure parts of installing, upgrading, removing and checking an installed exod: version
stamps, the service manager's commands, what the service's user can reach through the sandbox,
and where exoctl looks for a daemon."""

from __future__ import annotations

import errno
import os
import plistlib
import socket
import stat
import tempfile
import textwrap
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from click.testing import CliRunner

from exod import __version__, paths
from exod.cli.service import install as install_command
from exod.config import load_config
from exod.service_files import checks, files, install, steps, system_check
from exod.service_files.access import Identity, access_problem, hidden_by, reach_problem
from exod.service_files.install import PlannedFile
from exod.service_files.stamp import older, read_stamp, stamped
from tests.unit.conftest import make_model_dir

EXOD = Identity("exod", 990, frozenset({990}))
ROOT = Identity("root", 0, frozenset({0}))
REPO = Path(__file__).resolve().parents[2]
THIS_EXOD = str(install.exod_binary())


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    path.chmod(mode)
    return path


def with_stamp(text: str, version: str) -> str:
    """`text` as an exod of `version` would have stamped it."""
    return text.replace(f"installed by exod {__version__}", f"installed by exod {version}")


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
    files.write([PlannedFile(unit, "u"), PlannedFile(ours, "o"), PlannedFile(theirs, "t")])
    changes = files.remove([unit, ours])
    assert [(c.path, c.what) for c in changes] == [(unit, "removed"), (ours, "removed")]
    assert theirs.exists()
    theirs.unlink()
    files.write([PlannedFile(ours, "o")])
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


def test_try_bind_names_a_taken_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert system_check.try_bind("127.0.0.1", port) == os.strerror(errno.EADDRINUSE)
    assert system_check.try_bind("127.0.0.1", 0) is None


def test_every_port_exod_and_its_local_ranks_listen_on_is_checked(tmp_path: Path) -> None:
    """api.listen; each local rank of a multi-rank instance with port_base, and rank 0's
    control port (port_base + shards); not the ranks of other hosts, nor ports chosen at
    start (no port_base), nor a one-rank instance (it listens on nothing)."""
    model = make_model_dir(tmp_path / "m")
    key = write(tmp_path / "key", "k" * 32, 0o600)
    cfg = load_config(write(tmp_path / "exod.yaml", f"""
        node: {{name: box-1}}
        api: {{listen: "[::1]:8000"}}
        instances:
          here: {{model: {model}, shards: 2, port_base: 30000}}
          spread:
            model: {model}
            shards: 2
            port_base: 31000
            cluster_key_file: {key}
            hosts: [{{name: box-0, address: 10.0.0.1}}, {{name: box-1, address: 10.0.0.2}}]
          chosen: {{model: {model}, shards: 2}}
          one: {{model: {model}, port_base: 32000}}
        """))
    assert system_check.listeners(cfg) == [
        ("api.listen", "[::1]:8000"),
        ("instances.here.port_base (rank 0)", "127.0.0.1:30000"),
        ("instances.here.port_base (rank 1)", "127.0.0.1:30001"),
        ("instances.here.port_base (rank 0's group control)", "127.0.0.1:30002"),
        ("instances.spread.port_base (rank 1)", "10.0.0.2:31001")]
    tried: list[tuple[str, int]] = []

    def bind(host: str, port: int) -> str | None:
        tried.append((host, port))
        return "Address already in use" if port in (8000, 30002) else None

    problems = system_check.port_problems(cfg, bind)
    assert ("::1", 8000) in tried and ("10.0.0.2", 31001) in tried and len(tried) == 5
    assert [p.line() for p in problems] == [
        "problem: api.listen [::1]:8000 cannot be bound: Address already in use; fix: free it "
        "(`ss -ltnp 'sport = :8000'` shows who holds it) or change api.listen",
        "problem: instances.here.port_base (rank 0's group control) 127.0.0.1:30002 cannot be "
        "bound: Address already in use; fix: free it (`ss -ltnp 'sport = :30002'` shows who "
        "holds it) or change instances.here.port_base"]
    cfg_file = tmp_path / "exod.yaml"
    # While exod runs the ports are its own: not asked.
    assert system_check.config_problems(cfg_file, {}, ROOT, True, bind)[0] == []
    more, worst = system_check.config_problems(cfg_file, {}, ROOT, False, bind)
    assert more == problems and worst is not None


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


def no_runner(argv: list[str]) -> tuple[int, str]:
    raise AssertionError(f"systemd asked while not running: {argv}")


def test_unit_problems_an_older_stamp_and_a_stale_loaded_copy(tmp_path: Path) -> None:
    unit = write(tmp_path / "exod.service", "# installed by exod 0.0.1 (`exod install`)\n")
    [problem] = system_check.unit_problems(unit, no_runner, live=False)
    assert problem.what == (f"{unit} was installed by exod 0.0.1, older than this exod "
                            f"{__version__}")
    assert problem.fix == f"sudo {THIS_EXOD} install && sudo systemctl restart exod"
    asked: list[list[str]] = []

    def systemctl(reload_needed: str) -> steps.Runner:
        def run(argv: list[str]) -> tuple[int, str]:
            asked.append(argv)
            return 0, reload_needed + "\n"
        return run

    write(unit, stamped("[Service]\n", "unit"))
    assert system_check.unit_problems(unit, systemctl("no"), live=True) == []
    assert asked == [["systemctl", "show", "exod.service", "--property=NeedDaemonReload",
                      "--value"]]
    [problem] = system_check.unit_problems(unit, systemctl("yes"), live=True)
    assert "older copy of the unit" in problem.what
    assert problem.fix == "sudo systemctl daemon-reload"
    # A newer exod's unit, or a distribution's own (no stamp): no opinion.
    write(unit, "# installed by exod 999.0 (`exod install`)\n")
    assert system_check.unit_problems(unit, no_runner, live=False) == []


def test_user_problems_a_missing_user_or_group() -> None:
    svc = {"User": "exod", "Group": "exod", "SupplementaryGroups": "video render"}
    seen: list[tuple[str, str | None, list[str]]] = []

    def lookup(user: str, group: str | None, extra: list[str]) -> Identity | None:
        seen.append((user, group, extra))
        return None

    who, [problem] = system_check.user_problems(svc, lookup)
    assert who is None and seen == [("exod", "exod", ["video", "render"])]
    assert problem.line() == ("problem: the service user exod does not exist; fix: sudo "
                              "systemd-sysusers /etc/sysusers.d/exod.conf")
    who, [problem] = system_check.user_problems(svc, lambda *_: EXOD, lambda g: False)
    assert who == EXOD and problem.what == "the service group exod does not exist"
    assert system_check.user_problems(svc, lambda *_: EXOD, lambda g: True) == (EXOD, [])
    assert system_check.user_problems({}, lambda u, *_: ROOT if u == "root" else None) == \
        (ROOT, [])  # no User=: root


def test_check_installed_stops_at_a_missing_user(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the user nothing else can be judged as it: the unit's own problems and that."""
    unit = write(tmp_path / "exod.service",
                 "# installed by exod 0.0.1\n[Service]\nUser=exod-test-no-such-user\n")
    monkeypatch.setattr(checks, "SYSTEMD_UNITS", (tmp_path / "absent.service", unit))
    monkeypatch.setattr(steps, "systemd_running", lambda user: False)
    problems, summary = system_check.check_installed(None, no_runner)
    assert [p.what.split(" ")[-1] for p in problems] == [__version__, "exist"], problems
    assert summary == ""
    monkeypatch.setattr(checks, "SYSTEMD_UNITS", (tmp_path / "absent.service",))
    [problem], _ = system_check.check_installed(None, no_runner)
    assert problem.line() == f"problem: no exod.service is installed; fix: sudo {THIS_EXOD} install"


def test_dir_problems_owner_and_mode(tmp_path: Path) -> None:
    bases = {"RuntimeDirectory": tmp_path / "run", "StateDirectory": tmp_path / "lib"}
    svc = {"RuntimeDirectory": "exod", "RuntimeDirectoryMode": "0750", "StateDirectory": "exod"}
    assert system_check.dir_problems(svc, EXOD, bases) == []  # absent: systemd makes them
    (tmp_path / "run/exod").mkdir(parents=True, mode=0o750)
    (tmp_path / "run/exod").chmod(0o750)
    (tmp_path / "lib/exod").mkdir(parents=True)
    (tmp_path / "lib/exod").chmod(0o700)
    me = Identity("me", os.getuid(), frozenset({os.getgid()}))
    [problem] = system_check.dir_problems(svc, me, bases)
    assert problem.line() == (f"problem: {tmp_path}/lib/exod has mode 0700, the unit's "
                              f"StateDirectoryMode= is 0755; fix: sudo chmod 0755 "
                              f"{tmp_path}/lib/exod")
    (tmp_path / "lib/exod").chmod(0o755)
    assert system_check.dir_problems(svc, me, bases) == []
    problems = system_check.dir_problems(svc, EXOD, bases)  # the folders are not exod's
    assert [p.fix for p in problems] == [f"sudo chown -R exod: {tmp_path}/run/exod",
                                         f"sudo chown -R exod: {tmp_path}/lib/exod"]
    assert f"belongs to uid {os.getuid()}, not to exod" in problems[0].what


def test_exec_problems(tmp_path: Path) -> None:
    [problem] = system_check.exec_problems({}, ROOT)
    assert problem.what == "the unit has no ExecStart=" and THIS_EXOD in problem.fix
    missing = tmp_path / "bin/exod"
    [problem] = system_check.exec_problems({"ExecStart": f"{missing} run"}, ROOT)
    assert problem.what == f"ExecStart names {missing}, which is not an executable file"
    # The script is fine, its interpreter (a Python under a home) is hidden by the sandbox.
    write(missing, "#!/home/u/.pyenv/versions/3.11.7/bin/python3.11\n", 0o755)
    svc = {"ExecStart": f"-{missing} run -c /etc/exod/exod.yaml", "ProtectHome": "yes"}
    [problem] = system_check.exec_problems(svc, ROOT)
    assert problem.what == (f"the service cannot run {missing}: /home/u/.pyenv/versions/3.11.7/"
                            f"bin/python3.11 is hidden from the service by ProtectHome=yes")
    assert problem.fix == f"sudo {missing} install  (adds the read-only binds it needs)"
    svc["BindReadOnlyPaths"] = "/home/u/.pyenv/versions/3.11.7"
    svc["ProtectHome"] = "tmpfs"
    problems = system_check.exec_problems(svc, ROOT)
    # Bound: only the missing interpreter itself is left to report.
    assert all("No such file" in p.what for p in problems), problems
    svc["PrivateTmp"] = "yes"  # and the script itself in a private /tmp
    if str(missing).startswith("/tmp/"):
        [problem] = system_check.exec_problems(svc, ROOT)
        assert "hidden from the service by PrivateTmp=yes" in problem.what


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder every user may enter (pytest's tmp_path lies in a 0700 one)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        os.chmod(d, 0o755)
        yield Path(d)


def test_config_problems_a_config_the_service_user_cannot_read(shared_tmp: Path) -> None:
    config = write(shared_tmp / "exod.yaml", "api: {listen: ''}\n", 0o600)
    problems, worst = system_check.config_problems(config, {}, EXOD, active=True)
    assert [p.line() for p in problems] == [
        f"problem: config {config}: file {config} (mode 0600) is not readable by exod; "
        f"fix: sudo chgrp exod {config} && sudo chmod g+r {config}"]
    assert worst is not None  # read as root here: valid, so the ladder is still judged
    config.chmod(0o644)
    assert system_check.config_problems(config, {}, EXOD, active=True)[0] == []
    write(config, "api: {listen: nowhere}\n")
    [problem], worst = system_check.config_problems(config, {}, EXOD, active=True)
    assert problem.line() == (f"problem: config {config} is invalid (1 problem(s)); fix: "
                              f"exod check -c {config}")
    assert worst is None


def test_upgrade_over_an_older_unit_keeps_the_config_and_clears_the_warning(
        tmp_path: Path) -> None:
    """The files an older exod installed: `exod install` rewrites the unit (`updated`), keeps
    the operator's config, and the check's older-unit warning goes away."""
    plan = install.systemd_plan(Path("/opt/exod/bin/exod"), tmp_path)
    unit = tmp_path / install.SYSTEM_UNIT
    old_unit = with_stamp(plan[0].content, "0.0.1").replace("TimeoutStopSec=45",
                                                           "TimeoutStopSec=30")
    write(unit, old_unit)
    config = write(tmp_path / install.SYSTEM_CONFIG, "api: {listen: ''}  # mine\n", 0o640)
    [before] = system_check.unit_problems(unit, no_runner, live=False)
    assert "installed by exod 0.0.1, older than this exod" in before.what
    assert len(checks.check_stamp(unit)) == 1
    changes = {c.path: c.what for c in files.write(plan)}
    assert changes[unit] == "updated" and changes[config] == "kept"
    assert config.read_text() == "api: {listen: ''}  # mine\n"
    assert unit.read_text() == plan[0].content and read_stamp(unit.read_text()) == __version__
    assert system_check.unit_problems(unit, no_runner, live=False) == []
    assert checks.check_stamp(unit) == []
    assert {c.what for c in files.write(plan)} == {"unchanged", "kept"}


def test_plist_version_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`exod check` on a plist from an older exod: the stamp in its XML comment is read, the
    plist still parses, and the warning names this exod's install command."""
    plan = install.launchd_plan(Path("/opt/exod/bin/exod"), tmp_path, user=False)
    plist = write(tmp_path / "io.exod.exod.plist", with_stamp(plan[0].content, "0.0.1"))
    assert plistlib.loads(plist.read_bytes())["ExitTimeOut"] == 45
    assert checks.check_plist(plist, 25.0) == []
    [warning] = checks.check_stamp(plist)
    assert warning == (f"{plist} was installed by exod 0.0.1, older than this exod "
                       f"{__version__}: run `sudo {THIS_EXOD} install`, then restart the service")
    write(plist, plan[0].content)
    assert checks.check_stamp(plist) == []
    # An agent's plist (under the home) is reinstalled without sudo.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    agent = write(tmp_path / "home/Library/LaunchAgents/io.exod.exod.plist",
                  with_stamp(plan[0].content, "0.0.1"))
    assert f"run `{THIS_EXOD} install --user`" in checks.check_stamp(agent)[0]


def test_the_launch_daemons_log_folder_is_made_and_kept(tmp_path: Path) -> None:
    plan = install.launchd_plan(Path("/opt/exod/bin/exod"), tmp_path, user=False)
    logs = tmp_path / install.LAUNCHD_LOGS
    plist = plistlib.loads(plan[0].content.encode())
    assert Path(plist["StandardOutPath"]).parent == Path("/", install.LAUNCHD_LOGS)
    assert [c.what for c in files.write(plan) if c.path == logs] == ["created"]
    assert logs.is_dir() and stat.S_IMODE(logs.stat().st_mode) == 0o755
    assert [c.what for c in files.write(plan) if c.path == logs] == ["unchanged"]
    next_step = steps.next_steps(steps.Target("launchd", False), Path("/etc/exod/exod.yaml"),
                                 Path("/Library/LaunchDaemons/io.exod.exod.plist"), False, True)
    assert next_step == ["start: sudo launchctl bootstrap system "
                         "/Library/LaunchDaemons/io.exod.exod.plist"]
    out = CliRunner().invoke(install_command, ["--target", "launchd", "--root",
                                               str(tmp_path / "r"), "--dry-run"]).output
    assert f"--- {tmp_path}/r/Library/Logs/exod/ (folder) mode 0755 (only if absent)" in out
    assert not (tmp_path / "r").exists()


def _plan_paths(home: Path) -> list[str]:
    """Every path `exod install` writes, in each of its four modes, with the home as `~`."""
    exod = Path("/opt/exod/bin/exod")
    root = Path("/")
    plans = [install.systemd_plan(exod, root, ["/home/u/py"]),
             install.systemd_user_plan(exod, root, home),
             install.launchd_plan(exod, root, False), install.launchd_plan(exod, root, True, home)]
    return sorted({str(p.path).replace(str(home), "~") for plan in plans for p in plan})


def test_readme_man_page_and_help_name_the_same_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `exod install` writes is in the man page's FILES and in `exod install --help`; the
    README, the docs and the man page never say plain `sudo exod` (sudo's path has no pipx/uv/venv
    bin)."""
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    written = _plan_paths(Path("/home/u"))
    assert "~/.config/systemd/user/exod.service" in written and "/Library/Logs/exod" in written
    man = (REPO / "man/exod.8").read_text().replace("\\-", "-").replace("\\(ti", "~")
    files_section = man.split(".SH FILES")[1].split(".SH SEE ALSO")[0]
    helptext = CliRunner().invoke(install_command, ["--help"]).output
    for path in written:
        if path != "/etc/tmpfiles.d/exod.conf":  # only when the packaging ships one
            assert path in files_section, path
            assert path in helptext, path
    assert "$XDG_RUNTIME_DIR/exod/control.sock" in files_section
    assert "$XDG_RUNTIME_DIR/exod/control.sock" in helptext
    readme, service = (REPO / "README.md").read_text(), (REPO / "docs/service.md").read_text()
    docs = {path.name: path.read_text() for path in (REPO / "docs").rglob("*.md")}
    for name, text in {"README.md": readme, "exod.8": man, **docs}.items():
        assert "sudo exod " not in text and "sudo $(which" not in text, name
    for text in (readme, service):
        assert 'sudo "$(command -v exod)" install' in text
        assert 'sudo "$(command -v exod)" uninstall' in text
    assert service.count('sudo "$(command -v exod)" install') >= 3  # Linux, macOS, upgrading
