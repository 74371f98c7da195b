"""`exod install`: which service files go where, for systemd (system or user) and launchd.

Pure planning: the plans name every file with its content; writing them (files.py) and telling
the service manager (steps.py) happen elsewhere. The shipped unit names /usr/bin/exod and the
plists /usr/local/bin/exod; the installed copies name the exod that runs this command, and carry
a version stamp (stamp.py). An existing config is never overwritten.

An exod whose Python lies under a home directory (pyenv, uv, pipx, a venv in ~) is hidden by the
system unit's ProtectHome=yes. Instead of refusing, the plan adds a drop-in that keeps homes
empty (ProtectHome=tmpfs) and binds exactly the interpreter's prefix and the venv, read-only.
Likewise one under /tmp or /var/tmp, which both units' PrivateTmp=yes replaces with the
service's own: a drop-in binds exactly what the service needs from there, read-only.
"""

from __future__ import annotations

import os
import re
import shlex
import site
import sys
from dataclasses import dataclass
from pathlib import Path

from exod.service_files.stamp import stamped

PLIST_BIN = "/usr/local/bin/exod"  # what the shipped plists name; the units name /usr/bin/exod
# ProtectHome= hides these from the system service.
HIDDEN_BY_PROTECT_HOME = ("/home", "/root", "/run/user")
# PrivateTmp= gives the service these of its own.
HIDDEN_BY_PRIVATE_TMP = ("/tmp", "/var/tmp")
SYSTEM_UNIT = "etc/systemd/system/exod.service"
HOME_DROPIN = "etc/systemd/system/exod.service.d/exod-install-home.conf"
TMP_DROPIN = "exod.service.d/exod-install-tmp.conf"  # beside the unit, system or user
SYSUSERS = "etc/sysusers.d/exod.conf"
TMPFILES = "etc/tmpfiles.d/exod.conf"
SYSTEM_CONFIG = "etc/exod/exod.yaml"
SERVICE_GROUP = "exod"
# The LaunchDaemon logs here; launchd opens StandardOutPath but makes no folder for it.
LAUNCHD_LOGS = "Library/Logs/exod"


class InstallError(Exception):
    pass


@dataclass(frozen=True)
class PlannedFile:
    path: Path
    content: str
    mode: int = 0o644
    keep_existing: bool = False  # configs: an operator's edits win
    group: str | None = None  # chgrp once the group exists (the config: readable by exod)
    folder: bool = False  # a folder to make (no content), kept by `exod uninstall`


def _data_dirs() -> list[Path]:
    """packaging/ of a source checkout, then what the wheel put under PREFIX/share/exod (a venv,
    pipx, uv tool), then the user base of `pip install --user`."""
    return [Path(__file__).resolve().parents[2] / "packaging",
            Path(sys.prefix) / "share" / "exod",
            Path(site.getuserbase()) / "share" / "exod"]


def packaging_dir() -> Path:
    for candidate in _data_dirs():
        if (candidate / "systemd" / "exod.service").is_file():
            return candidate
    raise InstallError("cannot find exod's packaging files (packaging/ or PREFIX/share/exod)")


def example_config() -> str:
    for d in _data_dirs():
        for candidate in (d.parent / "config" / "exod.yaml", d / "exod.yaml"):
            if candidate.is_file():
                return candidate.read_text()
    raise InstallError("cannot find the example config (config/exod.yaml)")


def exod_binary() -> Path:
    """The `exod` script of this installation (next to the running interpreter)."""
    candidate = Path(sys.executable).parent / "exod"
    return candidate if candidate.exists() else Path(sys.argv[0]).resolve()


def exod_command(args: str, sudo: bool = True) -> str:
    """A command line that runs this exod by its full path: sudo's secure_path holds neither
    ~/.local/bin (pipx, uv tool) nor a venv's bin, so `sudo exod` finds no exod there."""
    return f"{'sudo ' if sudo else ''}{shlex.quote(str(exod_binary()))} {args}"


def _under(path: str, prefixes: tuple[str, ...] | list[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def needed_paths() -> list[str]:
    """What the service must read to run this exod: the interpreter's prefix, the venv, where
    the exod package itself lies (an editable install's checkout) and the other import paths
    (.pth additions). sys.path[0] is left out: it is the script's folder or the caller's cwd."""
    import exod

    candidates = [sys.base_prefix, sys.prefix, str(Path(exod.__file__).resolve().parents[1]),
                  *sys.path[1:]]
    return sorted({os.path.realpath(p) for p in candidates if p and os.path.exists(p)})


def home_binds(paths: list[str]) -> list[str]:
    """Those of `paths` that ProtectHome= would hide, without any that lies inside another."""
    return _outermost([p for p in paths if _under(p, HIDDEN_BY_PROTECT_HOME)])


def tmp_binds(paths: list[str]) -> list[str]:
    """Those of `paths` that PrivateTmp= would hide, without any that lies inside another."""
    return _outermost([p for p in paths if _under(p, HIDDEN_BY_PRIVATE_TMP)])


def _outermost(paths: list[str]) -> list[str]:
    hidden = sorted(paths)
    return [p for p in hidden if not _under(p, [q for q in hidden if q != p])]


def _quote(path: str) -> str:
    return f'"{path}"' if re.search(r"\s", path) else path


def home_dropin(binds: list[str]) -> str:
    return ("# This exod runs from a Python under a home directory, which ProtectHome=yes hides.\n"
            "# Homes stay empty (a tmpfs) except these folders, bound read-only.\n"
            "[Service]\nProtectHome=tmpfs\n"
            f"BindReadOnlyPaths={' '.join(_quote(b) for b in binds)}\n")


def tmp_dropin(binds: list[str]) -> str:
    return ("# This exod runs from a Python under /tmp or /var/tmp, which PrivateTmp=yes replaces\n"
            "# with the service's own. That stays private except these folders, bound read-only.\n"
            "[Service]\n"
            f"BindReadOnlyPaths={' '.join(_quote(b) for b in binds)}\n")


def with_exec(unit: str, exod: Path) -> str:
    return re.sub(r"(?m)^(ExecStart=[-@:+!]*)\S*/exod\b", rf"\g<1>{exod}", unit)


def systemd_plan(exod: Path, root: Path, binds: list[str] | None = None,
                 tmp: list[str] | None = None) -> list[PlannedFile]:
    """The system service; `binds`: the folders under home directories it needs (home_binds),
    `tmp`: those under /tmp and /var/tmp (tmp_binds)."""
    pkg = packaging_dir() / "systemd"
    unit = stamped(with_exec((pkg / "exod.service").read_text(), exod), "unit")
    plan = [PlannedFile(root / SYSTEM_UNIT, unit)]
    if binds:
        plan.append(PlannedFile(root / HOME_DROPIN, stamped(home_dropin(binds), "unit")))
    if tmp:
        plan.append(PlannedFile((root / SYSTEM_UNIT).parent / TMP_DROPIN,
                            stamped(tmp_dropin(tmp), "unit")))
    plan += [
        PlannedFile(root / SYSUSERS, (pkg / "exod.sysusers").read_text()),
        PlannedFile(root / SYSTEM_CONFIG, example_config(), 0o640, keep_existing=True,
                group=SERVICE_GROUP),
    ]
    tmpfiles = pkg / "exod.tmpfiles"
    if tmpfiles.is_file():
        plan.append(PlannedFile(root / TMPFILES, tmpfiles.read_text()))
    return plan


def user_dirs(home: Path) -> tuple[Path, Path]:
    """(systemd user unit folder, exod's config folder) of a user, honouring XDG_CONFIG_HOME."""
    xdg = os.environ.get("XDG_CONFIG_HOME")
    config = Path(xdg) if xdg and os.path.isabs(xdg) else home / ".config"
    return config / "systemd" / "user", config / "exod"


def _rooted(root: Path, path: Path) -> Path:
    return root / str(path).lstrip("/")


def systemd_user_plan(exod: Path, root: Path, home: Path,
                      tmp: list[str] | None = None) -> list[PlannedFile]:
    """A systemd user service: the user's own manager runs it as the user, so it reads the
    user's models; config in ~/.config/exod, socket in $XDG_RUNTIME_DIR/exod. `tmp`: the
    folders under /tmp and /var/tmp it needs (tmp_binds)."""
    units, config = user_dirs(home)
    text = (packaging_dir() / "systemd" / "exod-user.service").read_text()
    plan = [PlannedFile(_rooted(root, units / "exod.service"),
                        stamped(with_exec(text, exod), "unit"))]
    if tmp:
        plan.append(PlannedFile(_rooted(root, units / TMP_DROPIN),
                                stamped(tmp_dropin(tmp), "unit")))
    return [*plan, PlannedFile(_rooted(root, config / "exod.yaml"), example_config(), 0o600,
                           keep_existing=True)]


def launchd_plan(exod: Path, root: Path, user: bool, home: Path | None = None) -> list[PlannedFile]:
    pkg = packaging_dir() / "launchd"
    if user:
        home = home or Path.home()
        text = (pkg / "io.exod.exod.agent.plist").read_text()
        text = text.replace(PLIST_BIN, str(exod)).replace("~/", f"{home}/")
        return [
            PlannedFile(_rooted(root, home / "Library/LaunchAgents/io.exod.exod.plist"),
                    stamped(text, "plist")),
            PlannedFile(_rooted(root, home / ".config/exod/exod.yaml"), example_config(), 0o640,
                    keep_existing=True),
        ]
    text = (pkg / "io.exod.exod.plist").read_text().replace(PLIST_BIN, str(exod))
    return [
        PlannedFile(root / "Library/LaunchDaemons/io.exod.exod.plist", stamped(text, "plist")),
        PlannedFile(root / SYSTEM_CONFIG, example_config(), 0o640, keep_existing=True),
        PlannedFile(root / LAUNCHD_LOGS, "", 0o755, folder=True),
    ]
