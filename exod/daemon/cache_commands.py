"""`exoctl cache clear [NAME]`: empty instances' prompt caches, in RAM and on disk.

A ready instance's rank 0 is asked over its channel (exod.wire.messages.ClearCacheWork): it
clears its own tiers and, in a group, has every rank clear its own (exod.runner.group.lockstep),
so no rank ever holds an entry the others forgot. An instance with no runner alive has its
folder on this host emptied here (a remote rank's folder stays until its runner next clears
it): what stands there is removed as what it is, a link as a link (never followed), and the
answer names what could not be removed. One starting or stopping is refused: its runner may be
opening or writing that folder. A folder another exod holds is left alone
(exod.daemon.cache_owner).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from loguru import logger

from exod import cache_files
from exod.wire import control as cm
from exod.wire import messages as m
from exod.daemon.control import CommandError
from exod.daemon.instance import InstanceRuntime

RANK_PREFIX = "rank"


def clear(instances: list[InstanceRuntime],
          folder_of: Callable[[InstanceRuntime], Path | None]) -> cm.ClearedReply:
    out = []
    for inst in instances:
        link = inst.serving_link()
        if link is not None:
            link.send(m.ClearCacheWork())
            out.append(cm.ClearedCache(inst.name, "runner", 0))
        elif all(rank.pid is None for rank in inst.ranks):
            folder = folder_of(inst)
            if folder is None:
                out.append(cm.ClearedCache(inst.name, "none", 0, [
                    "its folder of the prompt cache is another exod's: left alone"]))
                continue
            freed, notes = empty(folder)
            out.append(cm.ClearedCache(inst.name, "files", freed, notes))
        else:
            raise CommandError(f"{inst.name} is {inst.state.value}: clear its cache once it is "
                               "ready or stopped")
    return cm.ClearedReply(out)


def empty(folder: Path) -> tuple[int, list[str]]:
    """Remove every rank's entries under an instance's folder: the bytes freed, and a line for
    each removal that was not a plain folder of entries, or not whole. The weights' hashes
    (weights.json) stay: they are no cache of prompts."""
    odd = cache_files.strange(folder, want_folder=True)
    if odd is not None:  # the instance's folder itself: not followed
        removed = cache_files.remove(folder)
        logger.warning("prompt cache: {}", removed.text())
        return removed.freed, [removed.text()]
    try:
        ranks = sorted(p for p in folder.iterdir() if p.name.startswith(RANK_PREFIX))
    except FileNotFoundError:
        return 0, []
    except OSError as e:
        raise CommandError(f"cannot read {folder}: {e.strerror or e}") from None
    freed, notes = 0, []
    for rank in ranks:
        removed = cache_files.remove(rank)
        freed += removed.freed
        if removed.what != "a folder" or not removed.whole:
            notes.append(removed.text())
    for note in notes:
        logger.warning("prompt cache: {}", note)
    return freed, notes
