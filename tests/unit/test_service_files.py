"""Service-manager files: systemd time spans and units, launchd plists, `exod check` warnings,
`exod install` plans. Pure file logic: no service manager needed."""

from __future__ import annotations

import math
import os
import plistlib
import shlex
import sys
from pathlib import Path

import pytest

from exod.config import load_config
from exod.config.schema import StopPolicy
from exod.core.ladder import worst_case
from exod import __version__
from exod.service_files import checks, files, install, steps
from exod.service_files.stamp import read_stamp
from exod.core.durations import parse_timespan
from exod.service_files.unitfile import load_unit, parse_unit

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "packaging/systemd/exod.service"
DAEMON_PLIST = REPO / "packaging/launchd/io.exod.exod.plist"
AGENT_PLIST = REPO / "packaging/launchd/io.exod.exod.agent.plist"
DEFAULT_WORST = worst_case(StopPolicy())


@pytest.mark.parametrize("text,seconds", [
    ("45s", 45), ("45", 45), ("1min 30s", 90), ("1min30s", 90), ("2h", 7200), ("500ms", 0.5),
    ("1.5s", 1.5), ("infinity", math.inf), ("3 min", 180), ("1d", 86400), ("100us", 1e-4),
])
def test_timespan(text: str, seconds: float) -> None:
    assert parse_timespan(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "5 parsecs", "1min x", "-5s"])
def test_bad_timespan(text: str) -> None:
    with pytest.raises(ValueError):
        parse_timespan(text)


def test_unit_parsing_with_continuations_comments_and_dropins(tmp_path: Path) -> None:
    unit = tmp_path / "x.service"
    unit.write_text("[Unit]\nDescription=x\n# c\n[Service]\nExecStart=/bin/a \\\n  b c\n"
                    "TimeoutStopSec=10s\n; other\nKillMode=process\n")
    (tmp_path / "x.service.d").mkdir()
    (tmp_path / "x.service.d/10-a.conf").write_text("[Service]\nTimeoutStopSec=60s\n")
    (tmp_path / "x.service.d/20-b.conf").write_text("[Service]\nKillMode=mixed\n")
    (tmp_path / "x.service.d/ignored.txt").write_text("[Service]\nKillMode=none\n")
    parsed = load_unit(unit)
    assert parsed["Service"]["ExecStart"] == "/bin/a  b c"
    assert parsed["Service"]["TimeoutStopSec"] == "60s"
    assert parsed["Service"]["KillMode"] == "mixed"
    assert parse_unit("[A]\nk=1\nk=2\n")["A"]["k"] == "2"


def write_unit(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "exod.service"
    p.write_text(f"[Service]\n{body}\n")
    return p


@pytest.mark.parametrize("body,fragment", [
    ("Type=notify\nKillMode=mixed\nTimeoutStopSec=20s", "TimeoutStopSec=20s is shorter"),
    ("Type=notify\nKillMode=mixed", "TimeoutStopSec=90s (default)"),
    ("Type=notify\nTimeoutStopSec=60s", "KillMode=control-group"),
    ("Type=notify\nKillMode=process\nTimeoutStopSec=60s", "KillMode=process"),
    ("KillMode=mixed\nTimeoutStopSec=60s", "Type=simple"),
    ("Type=notify\nKillMode=mixed\nTimeoutStopSec=soon", "TimeoutStopSec: bad"),
])
def test_check_unit_warns(tmp_path: Path, body: str, fragment: str) -> None:
    worst = 100.0 if "(default)" in fragment else DEFAULT_WORST
    warnings = checks.check_unit(write_unit(tmp_path, body), worst)
    assert any(fragment in w for w in warnings), warnings


def test_check_unit_quiet_when_right(tmp_path: Path) -> None:
    unit = write_unit(tmp_path, "Type=notify\nKillMode=mixed\nTimeoutStopSec=45s")
    assert checks.check_unit(unit, DEFAULT_WORST) == []
    assert checks.check_unit(unit, 60.0) != []  # a longer ladder needs more stop time


def test_shipped_unit_fits_the_default_ladder() -> None:
    assert checks.check_unit(UNIT, DEFAULT_WORST) == []
    svc = load_unit(UNIT)["Service"]
    assert svc["Type"] == "notify" and svc["KillMode"] == "mixed"
    assert parse_timespan(svc["TimeoutStopSec"]) > DEFAULT_WORST + checks.MARGIN


def test_check_plist(tmp_path: Path) -> None:
    assert checks.check_plist(DAEMON_PLIST, DEFAULT_WORST) == []
    assert checks.check_plist(AGENT_PLIST, DEFAULT_WORST) == []
    short = tmp_path / "short.plist"
    short.write_bytes(plistlib.dumps({"Label": "x", "ExitTimeOut": 10}))
    assert "ExitTimeOut 10 is shorter" in checks.check_plist(short, DEFAULT_WORST)[0]
    unset = tmp_path / "unset.plist"
    unset.write_bytes(plistlib.dumps({"Label": "x"}))
    assert "unset" in checks.check_plist(unset, DEFAULT_WORST)[0]
    junk = tmp_path / "junk.plist"
    junk.write_text("not a plist")
    assert "cannot read" in checks.check_plist(junk, DEFAULT_WORST)[0]


# launchd.plist(5): each key's type, and the values a ProcessType may take.
PLIST_TYPES = {"Label": str, "ProgramArguments": list, "RunAtLoad": bool, "KeepAlive": dict,
               "ThrottleInterval": int, "ExitTimeOut": int, "ProcessType": str,
               "StandardOutPath": str, "StandardErrorPath": str, "EnvironmentVariables": dict}


@pytest.mark.parametrize("path", [DAEMON_PLIST, AGENT_PLIST], ids=["daemon", "agent"])
def test_plists_follow_launchd_plist_5(path: Path) -> None:
    with open(path, "rb") as f:
        plist = plistlib.load(f)
    for key, kind in PLIST_TYPES.items():
        is_bool = isinstance(plist[key], bool)
        assert isinstance(plist[key], kind) and not (kind is int and is_bool), key
    assert plist["Label"] == "io.exod.exod"
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}  # restart after crashes only
    assert plist["ProcessType"] in ("Background", "Standard", "Adaptive", "Interactive")
    assert plist["ProcessType"] == "Interactive"
    assert plist["ExitTimeOut"] > DEFAULT_WORST + checks.MARGIN
    assert plist["ThrottleInterval"] >= 1
    assert all(isinstance(a, str) for a in plist["ProgramArguments"])


def test_plist_runs_what_the_unit_runs() -> None:
    exec_start = shlex.split(load_unit(UNIT)["Service"]["ExecStart"])
    with open(DAEMON_PLIST, "rb") as f:
        args = plistlib.load(f)["ProgramArguments"]
    assert Path(args[0]).name == Path(exec_start[0]).name == "exod"
    assert args[1:] == exec_start[1:]


def test_example_config_is_accepted() -> None:
    cfg = load_config(REPO / "config/exod.yaml")
    assert cfg.instances == {}
    assert worst_case(cfg.defaults.stop) == DEFAULT_WORST


def test_systemd_install_plan(tmp_path: Path) -> None:
    exod = Path("/opt/exod/bin/exod")
    plan = install.systemd_plan(exod, tmp_path)
    by_name = {p.path.relative_to(tmp_path).as_posix(): p for p in plan}
    unit = by_name["etc/systemd/system/exod.service"].content
    assert f"ExecStart={exod} run -c /etc/exod/exod.yaml" in unit
    assert read_stamp(unit) == __version__
    assert "etc/sysusers.d/exod.conf" in by_name
    assert not any("exod.service.d" in name for name in by_name)  # nothing hidden: no drop-in
    config = by_name["etc/exod/exod.yaml"]
    assert config.keep_existing and config.mode == 0o640 and config.group == "exod"

    (tmp_path / "etc/exod").mkdir(parents=True)
    (tmp_path / "etc/exod/exod.yaml").write_text("mine")
    changes = {c.path.relative_to(tmp_path).as_posix(): c.what for c in files.write(plan)}
    assert (tmp_path / "etc/exod/exod.yaml").read_text() == "mine"
    assert changes == {"etc/systemd/system/exod.service": "created",
                       "etc/sysusers.d/exod.conf": "created", "etc/exod/exod.yaml": "kept"}
    written = tmp_path / "etc/systemd/system/exod.service"
    assert written.read_text() == unit
    assert checks.check_unit(written, DEFAULT_WORST) == []
    # Idempotent: the second install changes nothing and says so.
    assert {c.what for c in files.write(plan)} == {"unchanged", "kept"}
    written.write_text(unit.replace("TimeoutStopSec=45", "TimeoutStopSec=20"))
    again = {c.path.name: c.what for c in files.write(plan)}
    assert again["exod.service"] == "updated" and written.read_text() == unit


@pytest.mark.parametrize("home", ["/root/.pyenv/versions/3.11.7", "/home/u/.local/share/uv/py"])
def test_systemd_install_binds_a_home_directory_python(tmp_path: Path, home: str) -> None:
    """An exod whose Python lies under a home gets a drop-in: homes stay an empty tmpfs except
    the interpreter's prefix and the venv, bound read-only (ProtectHome=yes would hide them)."""
    venv = "/home/u/venvs/exod"
    binds = install.home_binds([home, f"{home}/lib/python3.11", venv, "/usr/lib/python3"])
    assert binds == sorted([home, venv])
    plan = install.systemd_plan(Path(venv, "bin/exod"), tmp_path, binds)
    dropin = next(p for p in plan if p.path.name == "exod-install-home.conf")
    assert dropin.path.parent.name == "exod.service.d"
    svc = parse_unit(dropin.content)["Service"]
    assert svc == {"ProtectHome": "tmpfs", "BindReadOnlyPaths": " ".join(sorted([home, venv]))}
    files.write(plan)
    merged = load_unit(tmp_path / install.SYSTEM_UNIT)["Service"]
    assert merged["ProtectHome"] == "tmpfs" and merged["ExecStart"].startswith(venv)


def test_needed_paths_cover_this_interpreter_and_venv() -> None:
    need = install.needed_paths()
    for p in (sys.base_prefix, sys.prefix):
        assert any(os.path.realpath(p) == n or os.path.realpath(p).startswith(n + "/")
                   for n in need), (p, need)


def test_systemd_user_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    home = Path("/home/u")
    plan = install.systemd_user_plan(Path("/home/u/.venv/bin/exod"), tmp_path, home)
    assert [p.path for p in plan] == [tmp_path / "home/u/.config/systemd/user/exod.service",
                                      tmp_path / "home/u/.config/exod/exod.yaml"]
    svc = parse_unit(plan[0].content)["Service"]
    assert svc["ExecStart"] == "/home/u/.venv/bin/exod run -c %E/exod/exod.yaml"
    assert (svc["Type"], svc["KillMode"], svc["TimeoutStopSec"]) == ("notify", "mixed", "45")
    assert svc["RuntimeDirectory"] == "exod" and svc["PrivateUsers"] == "yes"
    assert "User" not in svc  # a user manager runs it as its own user
    assert parse_unit(plan[0].content)["Install"]["WantedBy"] == "default.target"
    assert plan[1].keep_existing and plan[1].mode == 0o600


def test_an_exod_under_tmp_is_bound_into_the_private_tmp(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Both units give the service a /tmp of its own (PrivateTmp=yes): an exod whose venv or
    import paths lie under /tmp or /var/tmp (a clone's venv there, say) found nothing there
    ("No module named 'click'"). Its install binds exactly those folders back, read-only."""
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    venv = "/tmp/try/venv"
    need = [venv, f"{venv}/lib/python3.11/site-packages", "/var/tmp/clone/.venv/lib/site",
            "/usr/lib/python3.11", "/home/u/.pyenv", "/tmpx/not-tmp"]
    tmp = install.tmp_binds(need)
    assert tmp == ["/tmp/try/venv", "/var/tmp/clone/.venv/lib/site"]
    assert install.home_binds(need) == ["/home/u/.pyenv"]  # ProtectHome= as before
    wanted = {"BindReadOnlyPaths": " ".join(tmp)}
    system = install.systemd_plan(Path(venv, "bin/exod"), tmp_path / "s", [], tmp)
    user = install.systemd_user_plan(Path(venv, "bin/exod"), tmp_path / "u", Path("/home/u"),
                                     tmp)
    for plan, unit in ((system, tmp_path / "s" / install.SYSTEM_UNIT),
                       (user, tmp_path / "u/home/u/.config/systemd/user/exod.service")):
        dropin = next(p for p in plan if p.path.name == "exod-install-tmp.conf")
        assert dropin.path == unit.parent / "exod.service.d/exod-install-tmp.conf"
        assert parse_unit(dropin.content)["Service"] == wanted
        files.write(plan)
        merged = load_unit(unit)["Service"]
        assert merged["PrivateTmp"] == "yes" and merged["BindReadOnlyPaths"] == " ".join(tmp)
    # Nothing under /tmp: no drop-in.
    assert not any(p.path.name == "exod-install-tmp.conf"
                   for p in install.systemd_user_plan(Path("/opt/exod/bin/exod"), tmp_path,
                                                      Path("/home/u"), []))


def test_launchd_install_plans(tmp_path: Path) -> None:
    exod = Path("/opt/exod/bin/exod")
    daemon = install.launchd_plan(exod, tmp_path, user=False)
    assert read_stamp(daemon[0].content) == __version__
    plist = plistlib.loads(daemon[0].content.encode())
    assert daemon[0].path == tmp_path / "Library/LaunchDaemons/io.exod.exod.plist"
    assert plist["ProgramArguments"][0] == str(exod)
    agent = install.launchd_plan(exod, tmp_path, user=True)
    plist = plistlib.loads(agent[0].content.encode())
    home = str(Path.home())
    assert plist["ProgramArguments"] == [str(exod), "run", "-c", f"{home}/.config/exod/exod.yaml"]
    assert plist["StandardErrorPath"].startswith(home)
    target = steps.Target("launchd", user=True)
    assert "bootstrap gui/" in steps.next_steps(target, agent[1].path, agent[0].path, False,
                                                True)[0]
    assert steps.before_uninstall(target) == [["launchctl", "bootout",
                                               f"gui/{os.getuid()}/io.exod.exod"]]
