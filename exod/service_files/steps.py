"""What exod asks of the service manager around installing and removing its files.

The commands are data (lists of argv), built by pure functions and run through one seam
(`Runner`), so the order and the words are unit-tested and launchd's side, which cannot run
here, is tested by its content alone. Nothing is run when installing under --root.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Runner = Callable[[list[str]], "tuple[int, str]"]


def run(argv: list[str]) -> tuple[int, str]:
    """The real seam: the command's exit code and its output (both streams, stripped)."""
    try:
        res = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=600)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    return res.returncode, (res.stdout + res.stderr).strip()


@dataclass(frozen=True)
class Target:
    manager: str  # systemd | launchd
    user: bool

    @property
    def systemctl(self) -> list[str]:
        return ["systemctl", "--user"] if self.user else ["systemctl"]


def systemd_running(user: bool) -> bool:
    """Whether a manager of that kind runs here (a container or chroot may have none)."""
    if not user:
        return Path("/run/systemd/system").is_dir()
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return xdg is not None and Path(xdg, "systemd", "private").exists()


def after_install(t: Target, changed: bool, sysusers: Path | None) -> list[list[str]]:
    """systemd: create the user, reload the units, enable at boot (not start: the operator
    checks the config first). launchd: nothing: bootstrap both loads and starts."""
    if t.manager != "systemd":
        return []
    cmds = [["systemd-sysusers", str(sysusers)]] if sysusers is not None else []
    if changed:
        cmds.append([*t.systemctl, "daemon-reload"])
    return [*cmds, [*t.systemctl, "enable", "exod.service"]]


def before_uninstall(t: Target, plist: Path | None = None) -> list[list[str]]:
    """Stop (exod's own ladder: systemd and launchd send exod SIGTERM and wait) and disable."""
    if t.manager == "systemd":
        return [[*t.systemctl, "disable", "--now", "exod.service"]]
    domain = f"gui/{os.getuid()}" if t.user else "system"
    return [["launchctl", "bootout", f"{domain}/io.exod.exod"]]


def after_uninstall(t: Target) -> list[list[str]]:
    if t.manager != "systemd":
        return []
    return [[*t.systemctl, "daemon-reload"], [*t.systemctl, "reset-failed", "exod.service"]]


def purge_user(name: str = "exod") -> list[list[str]]:
    """--purge also removes the system user sysusers made (its files are gone by then)."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        return []
    return [["userdel", name]]


def next_steps(t: Target, config: Path, plist: Path, active: bool, changed: bool) -> list[str]:
    """What the operator does next, one command a line."""
    if t.manager == "launchd":
        if t.user:
            return [f"start: launchctl bootstrap gui/{os.getuid()} {plist}"]
        return [f"start: sudo launchctl bootstrap system {plist}"]
    ctl = " ".join(t.systemctl)
    out = [f"config: {config} (check it: exod check -c {config})"]
    if active and changed:
        out.append(f"running: the old unit until `{ctl} restart exod` (loaded models reload; "
                   f"see docs/service.md, Upgrading)")
    else:
        out.append(f"start: {ctl} start exod")
    if t.user:
        user = pwd.getpwuid(os.getuid()).pw_name
        if not Path("/var/lib/systemd/linger", user).exists():
            out.append(f"linger: run `loginctl enable-linger {user}` to keep exod running "
                       f"without a login session (and to start it at boot)")
    return out


def commands_for_root(t: Target, sysusers: Path | None) -> list[str]:
    """Under --root nothing runs: the commands a package's post-install step would run."""
    return [" ".join(c) for c in after_install(t, True, sysusers)]
