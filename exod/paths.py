"""Default file locations shared by the daemon and exoctl (neither imports the other), and the
one way exod makes a folder: with its documented mode, whatever the umask."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

# The modes of the folders exod makes (docs/service.md, "Folders and their modes"). Private:
# exod's own cache (the demo model, probe verdicts), the prompt cache, the state folder, the
# runtime folder (0750 when a group may use the socket). Readable: the hub cache's folders, as
# huggingface_hub makes them under the usual umask (the folder above decides who gets there),
# the launchd log folder and the folders `exod install` writes into.
PRIVATE = 0o700
READABLE = 0o755


def make_dirs(path: Path, mode: int) -> list[Path]:
    """Make `path` and its missing parents, each with `mode` whatever the umask (mkdir cannot
    give more than `mode`; the chmod after it gives back what the umask took). A folder that
    exists is left as it is: it may be someone else's. The folders made, top first. OSError as
    mkdir raises it (FileExistsError: something that is not a folder stands in the way)."""
    path = Path(path)
    missing: list[Path] = []
    at = path
    while not at.is_dir():  # a link to a folder counts: an operator's path may go through one
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    made = []
    for folder in reversed(missing):
        try:
            os.mkdir(folder, mode)
        except FileExistsError:
            if folder.is_dir():  # made meanwhile by another process: theirs, left as it is
                continue
            raise
        _chmod_folder(folder, mode)
        made.append(folder)
    return made


def _chmod_folder(folder: Path, mode: int) -> None:
    """chmod through the folder itself, never through a link put in its place meanwhile."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(folder, flags)
    except PermissionError:  # mode 0 (a umask of 0777): a folder its owner cannot open yet
        if stat.S_ISLNK(os.lstat(folder).st_mode):
            raise
        os.chmod(folder, mode)
        return
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def wider(folder: Path, mode: int) -> str | None:
    """What `exod check` says of a folder of exod's whose mode has bits beyond `mode`; None
    when it has not (or is missing, or is not a folder, or is a sticky folder: a shared one
    such as /tmp, which a config may name for the control socket or the prompt cache, and
    which exod never made and must not be narrowed)."""
    try:
        st = os.lstat(folder)
    except OSError:
        return None
    have = stat.S_IMODE(st.st_mode)
    if not stat.S_ISDIR(st.st_mode) or have & stat.S_ISVTX or not have & 0o777 & ~mode:
        return None
    return (f"{folder} is mode {have:04o}, wider than the {mode:04o} exod gives it: "
            f"chmod {have & mode:o} {folder}")


def daemon_id(config: Path | None) -> str:
    """A daemon's name among others that share a folder (the prompt cache's): a hash of the
    config file it runs, so it is the same across restarts and reboots."""
    text = os.path.abspath(config) if config is not None else ""
    return hashlib.sha256(text.encode()).hexdigest()[:16]

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


def user_runtime_dir() -> Path | None:
    """The caller's XDG runtime folder, where a user service's RuntimeDirectory= lives: from
    XDG_RUNTIME_DIR, else /run/user/UID when it exists (sudo -u, cron and su leave the variable
    unset although the user's manager runs)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg)
    candidate = Path(f"/run/user/{os.geteuid()}")
    return candidate if sys.platform != "darwin" and candidate.is_dir() else None


def client_socket_candidates() -> list[Path]:
    """Where exoctl looks, in order: the caller's own daemon (a user service or `exod run`),
    then the system service's; for root, the system service's first. The first that exists
    wins, so a user service is found by default when no system daemon is there."""
    system = SYSTEM_RUNTIME_DIR / "control.sock"
    user_dir = user_runtime_dir()
    user = user_dir / "exod" / "control.sock" if user_dir else None
    own = default_control_socket()
    order = [system, user] if os.geteuid() == 0 else [own, user, system]
    return list(dict.fromkeys(p for p in order if p is not None))


def cache_dir() -> Path:
    """Prepared models (the demo) are cached here: STATE_DIRECTORY under systemd, else per user."""
    state = os.environ.get("STATE_DIRECTORY")
    if state:
        return Path(state.split(":")[0]) / "cache"
    return user_cache(os.environ) / "exod"


def user_cache(env: Mapping[str, str]) -> Path:
    """A user's cache folder, as the XDG base directory rules say: $XDG_CACHE_HOME, else
    ~/.cache."""
    xdg = env.get("XDG_CACHE_HOME")
    return Path(xdg) if xdg else Path.home() / ".cache"


def state_dir() -> Path:
    """What the daemon keeps across restarts (its reasoning seal key): systemd's
    StateDirectory= when set, else $XDG_STATE_HOME/exod when set, else /var/lib/exod for
    root and ~/.local/state/exod for a user."""
    state = os.environ.get("STATE_DIRECTORY")
    if state:
        return Path(state.split(":")[0])
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg:
        return Path(xdg) / "exod"
    if os.geteuid() == 0:
        return Path("/var/lib/exod")
    return Path.home() / ".local" / "state" / "exod"


SYSTEM_STATE = Path("/var/lib/exod")


def prompt_cache_base(env: Mapping[str, str], euid: int) -> Path:
    """Where instances keep the prompt cache's disk tier by default, in `prompt-cache`: the
    service's state directory (StateDirectory=), else its cache directory (a user unit's
    CacheDirectory=), else /var/lib/exod as root, else the user's cache (XDG_CACHE_HOME,
    ~/.cache)."""
    for var in ("STATE_DIRECTORY", "CACHE_DIRECTORY"):
        given = env.get(var)
        if given:
            return Path(given.split(":")[0]) / "prompt-cache"
    if euid == 0:
        return SYSTEM_STATE / "prompt-cache"
    return user_cache(env) / "exod" / "prompt-cache"


def client_socket() -> Path:
    """exoctl's default: the first candidate that exists; when none does, the one a daemon
    started the usual way would make (the caller's own, or the system service's for root)."""
    candidates = client_socket_candidates()
    return next((p for p in candidates if p.exists()), candidates[0] if os.geteuid() == 0
                else default_control_socket())
