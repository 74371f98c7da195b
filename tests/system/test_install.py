"""Installing exod as its users do, under the real systemd of the test guest, with a real mlx
runner: an exod in a venv under /home whose Python also lies under /home (as pyenv, uv or pipx
leave it) installed system-wide by its own `exod install`, checked (`exod check --system`
reports a model directory the service user cannot read, before any start), started, chatted
with, stopped at rung 1 and uninstalled with nothing left behind; then the same exod as a user
service under a user manager (`exod install --user`), ready, found by exoctl, stopped.

One guest serves the module. Its /etc/systemd/system is its own (etc_units), /home is a tmpfs of
its own, and the test's Python lies under /root or is bound under /home: whatever this
machine's Python is, the service runs one under a home directory. exod comes from a wheel
built from this checkout (`pip wheel`), installed without its dependencies, which a .pth file
takes from this checkout's venv: installing mlx and the rest afresh would take minutes and
prove nothing about exod.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.system.systemd import GUEST_DIR, REPO, SystemdGuest

pytestmark = pytest.mark.system

HOME = "/home/dev"
BASE = os.path.realpath(sys.base_prefix)
# The test's Python where it is when that is under a home (pyenv's under /root, say), else bound
# under /home: at its own path, since a Python built with a shared libpython finds it there
# (RPATH), and the service sees it at that path too.
PY = BASE if BASE.startswith(("/home/", "/root/")) else f"{HOME}/python"
VENV = f"{HOME}/venv"
EXOD = f"{VENV}/bin/exod"
EXOCTL = f"{VENV}/bin/exoctl"
PYVER = f"python{sys.version_info.major}.{sys.version_info.minor}"
MODEL = "/var/lib/exod-test/tiny"  # guest-private tmpfs, readable by user exod
UNIT = "exod.service"
USER_UNITS = "/run/exod-user-units"
T = "[Unit]\nDescription={}\nDefaultDependencies=no\n"


def build_wheel(out: Path) -> Path:
    """A wheel of this checkout's files (tracked, and new ones git does not ignore), built from
    a copy of them: built in the checkout, setuptools' build/ folder keeps modules a later
    commit removed, and the wheel carried them."""
    src = out / "src"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, check=True, capture_output=True,
                            timeout=60).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                          str(out), str(src)], check=False, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    return next(out.glob("exod-*.whl"))


def home_venv(g: SystemdGuest, wheel: Path) -> None:
    """A venv under /home made by a Python under /home, exod installed in it from the wheel."""
    g.run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/home", check=True)
    if PY != BASE:
        g.run("mkdir", "-p", PY, check=True)
        g.run("mount", "--bind", BASE, PY, check=True)
    g.run(f"{PY}/bin/{PYVER}", "-m", "venv", "--without-pip", VENV, check=True)
    g.run(sys.executable, "-m", "pip", "--python", f"{VENV}/bin/python", "install", "-q",
          "--no-deps", "--no-index", str(wheel), check=True)
    site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    g.write(f"{VENV}/lib/{PYVER}/site-packages/exod-test-deps.pth", os.path.realpath(site) + "\n")


@pytest.fixture(scope="module")
def installer(tmp_path_factory: pytest.TempPathFactory,
              tiny_model_factory: Callable[..., Path]) -> Iterator[SystemdGuest]:
    g = SystemdGuest(tmp_path_factory.mktemp("install-guest"), etc_units=True)
    wheel = build_wheel(g.dir / "wheel")  # the harness folder: seen by the guest at GUEST_DIR
    try:
        g.start()
        home_venv(g, Path(GUEST_DIR) / wheel.relative_to(g.dir))
        shutil.copytree(tiny_model_factory(layers=4), g.path(MODEL))
        yield g
    finally:
        g.exit()


def config(g: SystemdGuest, path: str, **instances: str) -> None:
    cfg = {"ready": "instances", "api": {"listen": "127.0.0.1:52415"},
           "instances": {n: {"model": m} for n, m in instances.items()}}
    g.write(path, json.dumps(cfg, indent=1) + "\n", 0o640)


def leftovers(g: SystemdGuest) -> list[str]:
    found = g.run("sh", "-c", "ls -d /etc/systemd/system/*exod* /etc/systemd/system/*/*exod* "
                  "/etc/sysusers.d/exod.conf /etc/exod /var/lib/exod /run/exod 2>/dev/null")
    users = g.run("getent", "passwd", "exod").stdout
    return found.stdout.split() + ([users.strip()] if users else [])


def test_system_service_from_a_home_directory_python(installer: SystemdGuest) -> None:
    g = installer
    res = g.run(EXOD, "install")
    assert res.returncode == 0, res.stdout + res.stderr
    for line in ("created   /etc/systemd/system/exod.service",
                 "created   /etc/systemd/system/exod.service.d/exod-install-home.conf",
                 "ran       systemd-sysusers /etc/sysusers.d/exod.conf",
                 "ran       systemctl enable exod.service", "start: systemctl start exod"):
        assert line in res.stdout, res.stdout
    dropin = g.path("/etc/systemd/system/exod.service.d/exod-install-home.conf").read_text()
    assert f"BindReadOnlyPaths={' '.join(sorted([PY, VENV]))}\n" in dropin, dropin
    again = g.run(EXOD, "install")
    assert "nothing changed" in again.stdout and "created" not in again.stdout, again.stdout
    score = g.run("systemd-analyze", "security", "--offline=true", "--no-pager",
                  "/etc/systemd/system/exod.service").stdout
    exposure = float(score.split("Overall exposure level for exod.service: ")[1].split()[0])
    assert exposure <= 2.0, score

    # Before any start: a model the service user cannot reach is reported with its fix.
    g.run("mkdir", "-p", "-m", "0700", "/var/lib/exod-test/private", check=True)
    shutil.copytree(g.path(MODEL), g.path("/var/lib/exod-test/private/tiny"))
    g.run("mkdir", "-p", f"{HOME}/models", check=True)
    shutil.copytree(g.path(MODEL), g.path(f"{HOME}/models/tiny"))
    config(g, "/etc/exod/exod.yaml", locked="/var/lib/exod-test/private/tiny",
           home=f"{HOME}/models/tiny", tiny=MODEL)
    check = g.run(EXOD, "check", "--system")
    assert check.returncode == 78, check.stdout + check.stderr
    problems = check.stderr.splitlines()
    assert len(problems) == 3 and problems[-1] == "installed service: 2 problems", problems
    assert problems[0].startswith(f"problem: instance home: model {HOME}/models/tiny: "
                                  f"{HOME}/models/tiny is hidden from the service by "
                                  "ProtectHome=tmpfs; fix: "), problems
    assert ("problem: instance locked: model /var/lib/exod-test/private/tiny: "
            "/var/lib/exod-test/private (mode 0700) is not searchable by exod; "
            "fix: sudo setfacl -m u:exod:x /var/lib/exod-test/private") in problems[1], problems
    assert g.show(UNIT, "ActiveState") == "inactive"  # checked before any start

    config(g, "/etc/exod/exod.yaml", tiny=MODEL)
    check = g.run(EXOD, "check", "--system")
    assert check.returncode == 0, check.stderr
    assert "OK for user exod" in check.stdout

    res = g.systemctl("start", UNIT)  # ready: instances: returns once the model is loaded
    assert res.returncode == 0, res.stderr + g.diagnostics(UNIT)
    assert g.show(UNIT, "StatusText") == "1/1 ready"
    chat = g.run(EXOCTL, "chat", "tiny", "Hello", "--max-tokens", "4")
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stdout + chat.stderr
    inv = g.show(UNIT, "InvocationID")
    assert g.systemctl("stop", UNIT).returncode == 0
    log = g.wait_journal(UNIT, "exod stopped")
    assert "ladder rung 1" in log and "ladder rung 2" not in log, log
    assert g.show(UNIT, "Result") == "success", inv

    gone = g.run(EXOD, "uninstall")
    assert gone.returncode == 0, gone.stderr
    assert "removed   /etc/systemd/system/exod.service" in gone.stdout, gone.stdout
    assert "kept      /etc/exod/exod.yaml" in gone.stdout
    assert g.path("/etc/exod/exod.yaml").exists()
    purge = g.run(EXOD, "uninstall", "--purge")
    assert purge.returncode == 0, purge.stderr
    assert leftovers(g) == [], leftovers(g)
    assert g.show(UNIT, "LoadState") == "not-found"
    assert not g.run("pgrep", "-f", "bin/exod run|exod.runner").stdout.strip()
    assert "nothing to remove" in g.run(EXOD, "uninstall").stdout


def user_manager(g: SystemdGuest, uid: str) -> str:
    """A systemd user manager for uid, as user@.service would start it (without PAM/logind),
    seeing only its user's units and a few empty targets of ours. Returns its unit name."""
    units = g.path(USER_UNITS)
    units.mkdir(mode=0o755, exist_ok=True)
    (units / "default.target").write_text(T.format("user default")
                                          + "Requires=basic.target\nAfter=basic.target\n")
    # app.slice too: the one systemd would make by itself has default dependencies
    # (Conflicts=shutdown.target), and stopping it in exit.target's transaction conflicts with
    # starting shutdown.target; the manager then ignores SIGTERM until TimeoutStopSec's SIGKILL.
    for name in ("basic.target", "shutdown.target", "paths.target", "sockets.target",
                 "timers.target", "app.slice"):
        (units / name).write_text(T.format(name))
    (units / "exit.target").write_text(T.format("exit") + "Requires=systemd-exit.service\n"
                                       "After=systemd-exit.service\n")
    (units / "systemd-exit.service").write_text(
        T.format("exit") + "Requires=shutdown.target\nAfter=shutdown.target\n"
        "SuccessAction=exit-force\n")
    # A real host made this when it first sandboxed a system service; the user manager, in its
    # user namespace, cannot.
    g.run("mkdir", "-p", "-m", "0700", "/run/systemd/unit-root", check=True)
    name = f"exod-test-user@{uid}.service"
    g.install_unit(name, T.format("user manager") + "[Service]\nType=notify\n"
                   f"User={uid}\nExecStart=/lib/systemd/systemd --user\n"
                   f"Environment=XDG_RUNTIME_DIR=/run/user/{uid} "
                   f"SYSTEMD_UNIT_PATH={HOME}/.config/systemd/user:{USER_UNITS}\n"
                   f"RuntimeDirectory=user/{uid}\nRuntimeDirectoryMode=0700\nDelegate=yes\n"
                   "KillMode=mixed\nTimeoutStopSec=30\n")
    g.daemon_reload()
    g.systemctl("start", name, check=True)
    return name


def open_root(g: SystemdGuest) -> None:
    """User dev must reach this test's Python, venv and checkout; those under root's 0700 home
    are bound back into a 0755 tmpfs /root (in the guest only), as a user's own Python would
    lie in their home."""
    keep = sorted({p for p in (BASE, os.path.realpath(sys.prefix), str(REPO))
                   if p.startswith("/root/")})
    for i, p in enumerate(keep):
        g.run("mkdir", "-p", f"/run/exod-keep/{i}", check=True)
        g.run("mount", "--bind", p, f"/run/exod-keep/{i}", check=True)
    if keep:
        g.run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/root", check=True)
    for i, p in enumerate(keep):
        g.run("mkdir", "-p", p, check=True)
        g.run("mount", "--bind", f"/run/exod-keep/{i}", p, check=True)


def test_user_service_reads_the_users_model(installer: SystemdGuest) -> None:
    g = installer
    open_root(g)
    g.run("useradd", "-M", "-d", HOME, "-U", "dev", check=True)
    g.run("chown", "dev:", HOME, check=True)
    uid = g.run("id", "-u", "dev").stdout.strip()
    gid = g.run("id", "-g", "dev").stdout.strip()
    manager = user_manager(g, uid)
    env = ["env", f"XDG_RUNTIME_DIR=/run/user/{uid}", f"HOME={HOME}", "USER=dev"]
    as_dev = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", *env]
    try:
        res = g.run(*as_dev, EXOD, "install", "--user")
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"created   {HOME}/.config/systemd/user/exod.service" in res.stdout
        assert "ran       systemctl --user enable exod.service" in res.stdout, res.stdout
        assert "loginctl enable-linger dev" in res.stdout, res.stdout
        shutil.copytree(g.path(MODEL), g.path(f"{HOME}/models/mine"))
        g.run("chown", "-R", "dev:", f"{HOME}/models", check=True)
        g.run("chmod", "-R", "go-rwx", f"{HOME}/models", check=True)  # only dev may read it
        config(g, f"{HOME}/.config/exod/exod.yaml", mine=f"{HOME}/models/mine")
        g.run("chown", "dev:", f"{HOME}/.config/exod/exod.yaml", check=True)

        start = g.run(*as_dev, "systemctl", "--user", "start", "exod")
        assert start.returncode == 0, start.stderr + g.journal(None, "-n", "60")
        status = g.run(*as_dev, EXOCTL, "status", "--json")  # no --socket: found by default
        assert status.returncode == 0, status.stderr
        [inst] = json.loads(status.stdout)["instances"]
        assert (inst["name"], inst["state"]) == ("mine", "ready"), inst
        stop = g.run(*as_dev, "systemctl", "--user", "stop", "exod")
        assert stop.returncode == 0, stop.stderr
        log = g.run("journalctl", "--no-pager", "-o", "cat", f"_UID={uid}").stdout
        assert "ladder rung 1" in log and "ladder rung 2" not in log, log
        gone = g.run(*as_dev, EXOD, "uninstall", "--user")
        assert f"removed   {HOME}/.config/systemd/user/exod.service" in gone.stdout, gone.stdout
    finally:
        g.systemctl("stop", manager)
    # It left through exit.target, as a user manager does at logout: not killed by a timeout.
    assert g.run("systemctl", "show", "-p", "Result", manager).stdout.strip() == \
        "Result=success"
