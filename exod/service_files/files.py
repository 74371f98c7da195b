"""Writing and removing the files of an install plan, saying what changed.

Installing twice changes nothing the second time and says so ("unchanged"); each file is
written under a temporary name and renamed into place, so a service manager never reads half a
unit.
"""

from __future__ import annotations

import grp
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from exod.paths import READABLE, make_dirs
from exod.service_files.install import PlannedFile


@dataclass(frozen=True)
class Change:
    path: Path
    what: str  # created | updated | unchanged | kept | removed | absent

    @property
    def changed(self) -> bool:
        return self.what in ("created", "updated", "removed")

    def line(self) -> str:
        note = " (exists; an operator's edits win)" if self.what == "kept" else ""
        return f"{self.what:<9} {self.path}{note}"


def _current(path: Path) -> tuple[str, int] | None:
    try:
        return path.read_text(), stat.S_IMODE(path.stat().st_mode)
    except (FileNotFoundError, UnicodeDecodeError):
        return None


def write(plan: list[PlannedFile]) -> list[Change]:
    out = []
    for item in plan:
        if item.folder:
            out.append(_make_folder(item))
            continue
        existed = item.path.exists()
        existing = _current(item.path) if existed else None
        if existed and item.keep_existing:
            out.append(Change(item.path, "kept"))
            continue
        if existing == (item.content, item.mode):
            out.append(Change(item.path, "unchanged"))
            continue
        make_dirs(item.path.parent, READABLE)
        tmp = item.path.with_name(f".{item.path.name}.tmp")
        tmp.write_text(item.content)
        os.chmod(tmp, item.mode)
        os.replace(tmp, item.path)
        out.append(Change(item.path, "updated" if existed else "created"))
    return out


def _make_folder(item: PlannedFile) -> Change:
    """A folder the service needs and its manager will not make (launchd's log folder): made
    with its mode if absent; an existing one is left as it is (the operator's, or ours)."""
    if item.path.is_dir():
        return Change(item.path, "unchanged")
    make_dirs(item.path, item.mode)
    return Change(item.path, "created")


def set_groups(plan: list[PlannedFile], changes: list[Change]) -> list[str]:
    """chgrp the files this run created that should be readable by the service's group (the
    config, 0640): possible only once systemd-sysusers has made the group."""
    created = {c.path for c in changes if c.what == "created"}
    out = []
    for item in plan:
        if item.group is None or item.path not in created:
            continue
        try:
            gid = grp.getgrnam(item.group).gr_gid
        except KeyError:
            out.append(f"warning: group {item.group} does not exist: {item.path} stays "
                       f"unreadable to the service (run systemd-sysusers, then chgrp)")
            continue
        os.chown(item.path, -1, gid)
        out.append(f"group     {item.path} -> {item.group}")
    return out


def remove(paths: list[Path], trees: tuple[Path, ...] = ()) -> list[Change]:
    """Remove files, then whole folders (`trees`, for --purge); then the folders the files
    leave empty (a drop-in folder), never one that still holds someone's file."""
    out = []
    for p in paths:
        if p.is_file() or p.is_symlink():
            p.unlink()
            out.append(Change(p, "removed"))
            parent = p.parent
            if parent.name.endswith(".d") and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                out.append(Change(parent, "removed"))
    for t in trees:
        if t.is_dir() and not t.is_symlink():
            shutil.rmtree(t)
            out.append(Change(t, "removed"))
    return out
