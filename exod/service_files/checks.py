"""`exod check --unit/--plist`: does the service manager give exod's ladder enough time?

systemd sends SIGKILL to everything left after TimeoutStopSec, launchd after ExitTimeOut. If that
comes before exod's own ladder has finished, runners die by the manager's SIGKILL, which is what
the ladder exists to prevent. With KillMode other than `mixed`, systemd also SIGTERMs the runners
directly, bypassing the ladder's first rung.
"""

from __future__ import annotations

import math
import os
import plistlib
import sys
from pathlib import Path

from exod import __version__
from exod.core.ladder import STOP_MARGIN
from exod.core.durations import parse_timespan
from exod.service_files.install import exod_command
from exod.service_files.stamp import older, read_stamp
from exod.service_files.unitfile import load_unit

# Room after the last SIGTERM for the SIGKILL rung, the reaping and exod's own exit.
MARGIN = STOP_MARGIN
SYSTEMD_DEFAULT_STOP = 90.0
LAUNCHD_DEFAULT_EXIT_TIMEOUT = 20.0

SYSTEMD_UNITS = (Path("/etc/systemd/system/exod.service"),
                 Path("/usr/local/lib/systemd/system/exod.service"),
                 Path("/usr/lib/systemd/system/exod.service"),
                 Path("/lib/systemd/system/exod.service"))
LAUNCHD_PLISTS = (Path("/Library/LaunchDaemons/io.exod.exod.plist"),
                  Path.home() / "Library/LaunchAgents/io.exod.exod.plist")


def user_unit() -> Path:
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "systemd/user/exod.service"


def check_stamp(path: Path) -> list[str]:
    """A service file written by an older exod: reinstall, then restart (docs/service.md:
    Upgrading)."""
    try:
        version = read_stamp(path.read_text())
    except (OSError, UnicodeDecodeError):
        return []
    if version is None or not older(version):
        return []
    user = str(path).startswith(str(Path.home()))
    again = exod_command("install --user" if user else "install", sudo=not user)
    return [f"{path} was installed by exod {version}, older than this exod {__version__}: "
            f"run `{again}`, then restart the service"]


def check_unit(path: Path, worst_case: float) -> list[str]:
    try:
        unit = load_unit(path)
    except OSError as e:
        return [f"{path}: cannot read: {e.strerror or e}"]
    svc = unit.get("Service", {})
    out = []
    stop_text = svc.get("TimeoutStopSec") or svc.get("TimeoutSec") or ""
    try:
        stop = parse_timespan(stop_text) if stop_text else SYSTEMD_DEFAULT_STOP
    except ValueError as e:
        out.append(f"{path}: TimeoutStopSec: {e}")
        stop = SYSTEMD_DEFAULT_STOP
    if stop < worst_case + MARGIN:
        shown = stop_text or f"{SYSTEMD_DEFAULT_STOP:g}s (default)"
        out.append(f"{path}: TimeoutStopSec={shown} is shorter than the ladder's worst case "
                   f"{worst_case:g}s + {MARGIN:g}s: systemd could SIGKILL runners first; "
                   f"set TimeoutStopSec={math.ceil(worst_case + MARGIN + 10)}s or more")
    kill_mode = svc.get("KillMode", "control-group")
    if kill_mode != "mixed":
        out.append(f"{path}: KillMode={kill_mode}: systemd would send SIGTERM to every runner "
                   f"at once, bypassing exod's ladder; use KillMode=mixed")
    kind = svc.get("Type", "simple")
    if kind not in ("notify", "notify-reload"):
        out.append(f"{path}: Type={kind}: systemd will not wait for exod's READY=1; "
                   f"use Type=notify")
    return out


def check_plist(path: Path, worst_case: float) -> list[str]:
    try:
        with open(path, "rb") as f:
            plist = plistlib.load(f)
    except (OSError, plistlib.InvalidFileException, ValueError) as e:
        return [f"{path}: cannot read as a property list: {e}"]
    out = []
    timeout = plist.get("ExitTimeOut")
    if not isinstance(timeout, int) or isinstance(timeout, bool):
        if timeout is not None:
            out.append(f"{path}: ExitTimeOut must be an integer")
        timeout = LAUNCHD_DEFAULT_EXIT_TIMEOUT
        shown = f"unset (launchd's default, about {LAUNCHD_DEFAULT_EXIT_TIMEOUT:g}s)"
    else:
        shown = str(timeout)
    if timeout < worst_case + MARGIN:
        out.append(f"{path}: ExitTimeOut {shown} is shorter than the ladder's worst case "
                   f"{worst_case:g}s + {MARGIN:g}s: launchd could SIGKILL exod and runners "
                   f"first; set it to {math.ceil(worst_case + MARGIN + 10)} or more")
    return out


def installed() -> list[tuple[str, Path]]:
    """The service files found where systemd or launchd would read them."""
    if sys.platform == "darwin":
        return [("plist", p) for p in LAUNCHD_PLISTS if p.exists()][:1]
    system = [("unit", p) for p in SYSTEMD_UNITS if p.exists()][:1]
    user = [("unit", user_unit())] if os.geteuid() != 0 and user_unit().exists() else []
    return system + user
