"""Default file locations shared by the daemon and exoctl (neither imports the other)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SYSTEM_RUNTIME_DIR = Path("/var/run/exod" if sys.platform == "darwin" else "/run/exod")


def runtime_dir() -> Path:
    """Where sockets live: systemd's RuntimeDirectory= when set (the service runs as user
    exod), /run/exod for root (/var/run/exod on macOS, which has no /run), else per user."""
    given = os.environ.get("RUNTIME_DIRECTORY")
    if given:
        return Path(given.split(":")[0])
    if os.geteuid() == 0:
        return SYSTEM_RUNTIME_DIR
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "exod"
    return Path(f"/tmp/exod-{os.geteuid()}")


def default_control_socket() -> Path:
    return runtime_dir() / "control.sock"


def client_socket_candidates() -> list[Path]:
    """Where exoctl looks, in order: the caller's own daemon, then the system service's."""
    system = SYSTEM_RUNTIME_DIR / "control.sock"
    own = default_control_socket()
    return [own] if own == system else [own, system]


def cache_dir() -> Path:
    """Prepared models (the demo) are cached here: STATE_DIRECTORY under systemd, else per user."""
    state = os.environ.get("STATE_DIRECTORY")
    if state:
        return Path(state.split(":")[0]) / "cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "exod"
