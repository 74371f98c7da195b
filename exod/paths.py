"""Default file locations shared by the daemon and exoctl (neither imports the other)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def runtime_dir() -> Path:
    """Where sockets live: /run/exod for root (systemd's RuntimeDirectory; /var/run/exod on
    macOS, which has no /run), else per user."""
    if os.geteuid() == 0:
        return Path("/var/run/exod" if sys.platform == "darwin" else "/run/exod")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "exod"
    return Path(f"/tmp/exod-{os.geteuid()}")


def default_control_socket() -> Path:
    return runtime_dir() / "control.sock"


def cache_dir() -> Path:
    """Prepared models (the demo) are cached here: STATE_DIRECTORY under systemd, else per user."""
    state = os.environ.get("STATE_DIRECTORY")
    if state:
        return Path(state.split(":")[0]) / "cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "exod"
