"""Sockets and directories are trusted only when they are ours: shared by the daemon and exoctl.

The attack this stops: another user pre-creates exod's runtime directory (e.g. /tmp/exod-UID,
used when XDG_RUNTIME_DIR is unset, as under sudo, cron or ssh) with a control socket of their
own, and exoctl then believes their answers and sends them the API token.

- The daemon creates its runtime directory 0700 (0750 when a group may use the socket) and
  refuses one another user owns or that others can write; it binds its sockets under a
  temporary name and renames them into place once their mode is set (no chmod window).
- exoctl talks to a socket only inside a directory that it, root or (for the system service)
  the owner of a root-made directory owns, that others cannot write; then it checks the
  daemon's uid on the connection itself (SO_PEERCRED / LOCAL_PEERCRED).
- The daemon checks each client's uid the same way: its own, root, or a member of the group
  the socket is shared with.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
import stat
import struct
import sys
from pathlib import Path

from exod.paths import READABLE, make_dirs


class Untrusted(OSError):
    pass


def _describe_owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


# ---- the daemon's side ------------------------------------------------------------------
def ensure_private_dir(path: Path, group_access: bool, gid: int | None = None) -> None:
    """Create `path` as exod's runtime directory, mode 0700 (0750 when `group_access`), group
    `gid` when given; or adopt an existing one that is exod's user's and that no one else may
    write to (an existing folder is never changed: it may be shared, like /run). Raises
    Untrusted (one line) otherwise."""
    mode = 0o750 if group_access else 0o700
    make_dirs(path.parent, READABLE)  # parents that lead to it: 0755 whatever the umask
    try:
        os.mkdir(path, mode)
        created = True
    except FileExistsError:
        created = False
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise Untrusted(f"{path} is not a directory (a symlink or a file): refusing to use it "
                        "as exod's runtime directory")
    if st.st_uid != os.geteuid():
        raise Untrusted(f"{path} belongs to {_describe_owner(st.st_uid)}, not to this user: "
                        "refusing to use it as exod's runtime directory (remove it, or set "
                        "control.socket elsewhere)")
    if created:
        os.chmod(path, mode)  # whatever the umask took away or added
        if gid is not None:
            os.chown(path, -1, gid)
    elif st.st_mode & 0o022:
        raise Untrusted(f"{path} may be written by other users (mode "
                        f"{stat.S_IMODE(st.st_mode):04o}), who could replace exod's sockets: "
                        "refusing to use it (chmod go-w, or set control.socket elsewhere)")


def bind_unix(sock: socket.socket, path: Path, mode: int, gid: int | None = None) -> None:
    """Bind `sock` at `path` with `mode` from the first instant: bound under a temporary name,
    given its mode (and group), then renamed into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
    sock.bind(str(tmp))
    try:
        os.chmod(tmp, mode)
        if gid is not None:
            os.chown(tmp, -1, gid)
        os.rename(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise


def group_gid(name: str | None) -> int | None:
    """The gid of a configured group name; KeyError when there is none."""
    return None if name is None else grp.getgrnam(name).gr_gid


def peer_creds(sock: socket.socket) -> tuple[int, int] | None:
    """(uid, gid) of the process at the other end of a connected AF_UNIX socket, or None on a
    platform that cannot tell (then only the socket's file permissions protect it)."""
    if sys.platform.startswith("linux"):
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, gid = struct.unpack("3i", raw)
        return uid, gid
    if sys.platform == "darwin" or "bsd" in sys.platform:
        # struct xucred: u_int version; uid_t uid; short ngroups; gid_t groups[16]
        level = getattr(socket, "SOL_LOCAL", 0)
        opt = getattr(socket, "LOCAL_PEERCRED", 1)
        raw = sock.getsockopt(level, opt, 76)
        _version, uid, _ngroups, _pad, gid = struct.unpack_from("=IIhhI", raw)
        return uid, gid
    return None


def _overflow_uid() -> int:
    try:
        return int(Path("/proc/sys/kernel/overflowuid").read_text())
    except (OSError, ValueError):
        return 65534


def in_user_namespace() -> bool:
    """True under e.g. systemd's PrivateUsers=: users outside the namespace then show up as
    the overflow uid ('nobody') on the socket."""
    try:
        text = Path("/proc/self/uid_map").read_text().split()
    except OSError:
        return False
    return text[:3] != ["0", "0", "4294967295"]


class ClientPolicy:
    """Who may use the control socket: exod's own uid, root, and the members of `gid` (the
    group the socket is shared with, when its mode grants the group access)."""

    def __init__(self, gid: int | None) -> None:
        self.uid = os.geteuid()
        self.gid = gid
        self.members: set[str] = set()
        if gid is not None:
            try:
                self.members = set(grp.getgrgid(gid).gr_mem)
            except KeyError:
                pass
        self.hidden_ok = gid is not None and in_user_namespace()
        self.overflow = _overflow_uid()

    def allows(self, uid: int, gid: int) -> bool:
        if uid in (self.uid, 0):
            return True
        if self.gid is None:
            return False
        if gid == self.gid:
            return True
        if self.hidden_ok and uid == self.overflow:
            return True  # someone the file permissions let in, whom the namespace hides
        try:
            return pwd.getpwuid(uid).pw_name in self.members
        except KeyError:
            return False


# ---- exoctl's side --------------------------------------------------------------------------
def _root_made(parent: Path) -> bool:
    """Only root can create entries in `parent` (e.g. /run): then whoever owns a directory in
    it got it from root (systemd's RuntimeDirectory=)."""
    try:
        st = os.stat(parent)
    except OSError:
        return False
    return st.st_uid == 0 and not st.st_mode & 0o022


def socket_problem(path: Path) -> str | None:
    """Why exoctl must not talk to the socket at `path`, or None when it is trusted."""
    return _check_socket(path)[0]


def trusted_daemon_uids(path: Path) -> set[int]:
    """The uids the daemon behind `path` may run as: this user, root, and the owner of a
    directory that root made for it."""
    return _check_socket(path)[1]


def _check_socket(path: Path) -> tuple[str | None, set[int]]:
    me = os.geteuid()
    trusted = {me, 0}
    folder = path.parent
    try:
        dst = os.stat(folder)
        sst = os.lstat(path)
    except FileNotFoundError:
        return None, trusted  # nothing there: "not running" is said elsewhere
    except OSError as e:
        return f"cannot inspect {path}: {e.strerror}", trusted
    if dst.st_uid not in trusted:
        if not _root_made(folder.parent):
            return (f"{folder} belongs to {_describe_owner(dst.st_uid)}, who could have put "
                    "any program behind its socket: not talking to it (set EXOD_SOCKET or "
                    "--socket to your daemon's socket)"), trusted
        trusted.add(dst.st_uid)  # e.g. /run/exod, made by systemd for user exod
    if dst.st_mode & 0o002:
        return (f"{folder} is writable by every user, who could replace its socket: not "
                "talking to it"), trusted
    if stat.S_ISLNK(sst.st_mode):
        return f"{path} is a symlink: not talking to it", trusted
    if not stat.S_ISSOCK(sst.st_mode):
        return f"{path} is not a socket", trusted
    if sst.st_uid not in trusted:
        return (f"{path} belongs to {_describe_owner(sst.st_uid)}, not to exod's user: not "
                "talking to it"), trusted
    return None, trusted
