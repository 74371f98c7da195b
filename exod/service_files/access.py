"""Can the service's user read a path? Answered from the files' modes and the unit's sandbox,
without becoming that user: `exod check --system` runs before any start, as root.

Two ways a path is out of the service's reach: the sandbox hides it (ProtectHome= hides /home,
/root and /run/user unless a Bind*Paths= brings a folder back; PrivateTmp= gives it its own
/tmp), or a folder on the way is not searchable / the file not readable by the user's uid and
groups. ACLs are not read: a path they open is reported, with the ACL as one possible fix.
"""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HOMES = ("/home", "/root", "/run/user")
TMPS = ("/tmp", "/var/tmp")
Stat = Callable[[str], os.stat_result]


@dataclass(frozen=True)
class Identity:
    name: str
    uid: int
    gids: frozenset[int]


def identity(user: str, group: str | None, extra: list[str]) -> Identity | None:
    """The service's user with every group it runs with; None when the user does not exist."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return None
    gids = {pw.pw_gid}
    for name in ([group] if group else []) + extra:
        try:
            gids.add(grp.getgrnam(name).gr_gid)
        except KeyError:
            pass
    gids.update(g.gr_gid for g in grp.getgrall() if user in g.gr_mem)
    return Identity(user, pw.pw_uid, frozenset(gids))


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def _bind_sources(svc: dict[str, str]) -> list[str]:
    text = f"{svc.get('BindPaths', '')} {svc.get('BindReadOnlyPaths', '')}"
    return [w.lstrip("-").split(":")[0] for w in shlex.split(text)]


def hidden_by(path: str, svc: dict[str, str]) -> str | None:
    """The setting of the unit's [Service] that hides `path` from the service, if any."""
    if any(_under(path, b) for b in _bind_sources(svc)):
        return None
    if svc.get("ProtectHome", "no") in ("yes", "true", "tmpfs") and \
            any(_under(path, h) for h in HOMES):
        return f"ProtectHome={svc['ProtectHome']}"
    if svc.get("PrivateTmp", "no") in ("yes", "true") and any(_under(path, t) for t in TMPS):
        return "PrivateTmp=yes"
    for p in shlex.split(svc.get("InaccessiblePaths", "")):
        if _under(path, p.lstrip("-+")):
            return f"InaccessiblePaths={p}"
    return None


def _allowed(st: os.stat_result, who: Identity, bits: int) -> bool:
    """bits: 4 read, 1 search/execute, as in the owner/group/other triplets."""
    if who.uid == 0:
        return True
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == who.uid:
        shift = 6
    elif st.st_gid in who.gids:
        shift = 3
    else:
        shift = 0
    return (mode >> shift) & bits == bits


def access_problem(path: Path, who: Identity, stat_fn: Stat = os.stat,
                   skip: int = 1) -> tuple[str, str] | None:
    """(why not, one-line fix) when `who` cannot read `path` (a directory: list and enter it),
    else None. Every folder on the way must be searchable, but the first `skip` parts (folders
    the sandbox makes anew, such as the tmpfs homes above a bound folder)."""
    parts = Path(os.path.abspath(path)).parts
    for i in range(max(1, skip), len(parts)):
        d = os.path.join(*parts[:i])
        try:
            st = stat_fn(d)
        except OSError as e:
            return f"{d}: {e.strerror}", "check the path"
        if not _allowed(st, who, 1):
            return (f"{d} (mode {stat.S_IMODE(st.st_mode):04o}) is not searchable by {who.name}",
                    f"sudo setfacl -m u:{who.name}:x {d}  (or move the files elsewhere)")
    try:
        st = stat_fn(str(path))
    except OSError as e:
        return f"{path}: {e.strerror}", "check the path"
    need = 5 if stat.S_ISDIR(st.st_mode) else 4
    if not _allowed(st, who, need):
        what = "folder" if need == 5 else "file"
        return (f"{what} {path} (mode {stat.S_IMODE(st.st_mode):04o}) is not readable by "
                f"{who.name}",
                f"sudo chgrp {'-R ' if need == 5 else ''}{who.name} {path} && sudo chmod "
                f"{'-R g+rX' if need == 5 else 'g+r'} {path}")
    return None


def reach_problem(path: Path, who: Identity, svc: dict[str, str],
                  stat_fn: Stat = os.stat) -> tuple[str, str] | None:
    """`path` as the service sees it: hidden by the sandbox, or not readable by `who`."""
    setting = hidden_by(str(path), svc)
    if setting is not None:
        return (f"{path} is hidden from the service by {setting}",
                f"move it out of {', '.join(HOMES + TMPS)}, or bind it: "
                f"`sudo systemctl edit exod`, [Service] BindReadOnlyPaths={path}")
    # Above a folder bound into a tmpfs home, the folders are the sandbox's own (0755).
    binds = [b for b in _bind_sources(svc) if _under(str(path), b)
             and any(_under(b, h) for h in HOMES)]
    skip = len(Path(binds[0]).parts) if binds else 1
    return access_problem(path, who, stat_fn, skip)


def tree_problem(path: Path, who: Identity, svc: dict[str, str],
                 stat_fn: Stat = os.stat) -> tuple[str, str] | None:
    """A model directory: itself and every file directly in it (and the targets of symlinks,
    as in a Hugging Face cache snapshot), visible to the service and readable by `who`."""
    targets = [path]
    if path.is_dir():
        targets += sorted(path.iterdir())
    for t in targets:
        for p in dict.fromkeys([t, Path(os.path.realpath(t))]):
            problem = reach_problem(p, who, svc, stat_fn)
            if problem is not None:
                return problem
    return None
