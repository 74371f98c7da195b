"""This daemon's own folder in each prompt cache folder its instances use.

Several daemons may share a `prompt_cache_dir` (the default one, as two daemons of one user do).
Each keeps its instances' disk tiers in DIR/ID/NAME, ID a hash of its config file's path
(exod.paths.daemon_id: the same across restarts and reboots), and holds a lock on DIR/ID/.lock
while it runs (flock: the kernel lets go of it when the daemon exits, however it exits). A
runner removes only inside its own instance's folder (other weights or settings, damaged
files), so a daemon never removes what another uses, running or stopped. Two daemons started
from the same config file are one ID: the second finds the lock held, and its instances keep
no disk tier in that folder (said once in the log) rather than remove the first one's entries.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from loguru import logger

from exod import cache_files, paths
from exod.config.schema import Instance

LOCK = ".lock"  # no instance name starts with a dot


def base_folder(c: Instance, env: Mapping[str, str], config: Path | None) -> Path:
    """DIR/ID: where a daemon run from `config` keeps its instances' disk tiers in `c`'s
    `prompt_cache_dir` (or the default one `env` says)."""
    root = c.prompt_cache_dir or paths.prompt_cache_base(env, os.geteuid())
    return root / paths.daemon_id(config)


def prompt_cache_folder(c: Instance, env: Mapping[str, str], config: Path | None) -> Path:
    """The instance's own folder of the disk tier, DIR/ID/NAME (`exoctl cache clear` empties
    it)."""
    return base_folder(c, env, config) / c.name


class CacheOwner:
    def __init__(self, config: Path | None, env: Mapping[str, str]) -> None:
        self.config = config
        self.env = env
        self._held: dict[Path, int] = {}  # DIR/ID → the descriptor that holds its lock
        self._busy: dict[Path, str] = {}  # DIR/ID → whose it is, while another exod holds it

    def folder(self, c: Instance) -> Path | None:
        """`c`'s folder, None while another exod holds the folder it is in (or it cannot be
        made a folder of this daemon's)."""
        base = base_folder(c, self.env, self.config)
        return None if base in self._busy else base / c.name

    def busy(self, c: Instance) -> str | None:
        """Why `c` keeps no disk tier: its folder is another exod's, or not a folder."""
        return self._busy.get(base_folder(c, self.env, self.config))

    def claim(self, instances: Iterable[Instance]) -> None:
        """Lock the folder of every instance with a disk tier (at start and at each reload; one
        held already stays held, one another exod held is tried again)."""
        bases = dict.fromkeys(base_folder(c, self.env, self.config) for c in instances
                              if c.prompt_cache_disk_bytes > 0)
        for base in bases:
            if base in self._held:
                continue
            why = self._lock(base)
            if why is None:
                self._busy.pop(base, None)
            elif base not in self._busy:
                self._busy[base] = why
                logger.warning("prompt cache: {}: this daemon's instances keep no disk tier "
                               "there", why)

    def _lock(self, base: Path) -> str | None:
        """Take `base`'s lock; why this daemon may not use it (another process holds it, or
        what stands there is not a folder and stays), else None (taken, or it cannot be taken
        at all: then the runners say what is wrong with the folder)."""
        try:
            odd = cache_files.strange(base, want_folder=True)
            if odd is not None:  # exod's own name: what stands there is not followed, removed
                removed = cache_files.remove(base)
                logger.warning("prompt cache: {}", removed.text())
                if not removed.whole:
                    return f"{base} is {odd}, and it cannot be removed"
            paths.make_dirs(base, paths.PRIVATE)
            fd = os.open(base / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except OSError as e:
            logger.warning("prompt cache: cannot lock {}: {}", base, e.strerror or e)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                whose = os.pread(fd, 512, 0).decode(errors="replace").strip() or "?"
            finally:
                os.close(fd)
            return (f"{base} is in use by another exod ({whose}), started from the same config "
                    "file (give one of the two another prompt_cache_dir)")
        except OSError as e:  # a filesystem without locks: nothing shows the folder busy
            os.close(fd)
            logger.warning("prompt cache: cannot lock {}: {}", base, e.strerror or e)
            return None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, config {self.config}\n".encode(), 0)
        self._held[base] = fd
        return None
