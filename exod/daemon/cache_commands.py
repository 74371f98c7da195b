"""`exoctl cache clear [NAME]`: empty instances' prompt caches, in RAM and on disk.

A ready instance's rank 0 is asked over its channel (exod.messages.ClearCache): it clears its
own tiers and, in a group, has every rank clear its own (exod.runner.group.lockstep), so no
rank ever holds an entry the others forgot. An instance with no runner alive has its folder on
this host emptied here (a remote rank's folder stays until its runner next clears it). One
starting or stopping is refused: its runner may be opening or writing that folder.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from exod import control_messages as cm
from exod import messages as m
from exod.daemon.control import CommandError
from exod.daemon.instance import InstanceRuntime


def clear(instances: list[InstanceRuntime], folder_of: Callable[[InstanceRuntime], Path]
          ) -> cm.ClearedReply:
    out = []
    for inst in instances:
        link = inst.serving_link()
        if link is not None:
            link.send(m.ClearCache())
            out.append(cm.ClearedCache(inst.name, "runner", 0))
        elif all(rank.pid is None for rank in inst.ranks):
            out.append(cm.ClearedCache(inst.name, "files", empty(folder_of(inst))))
        else:
            raise CommandError(f"{inst.name} is {inst.state.value}: clear its cache once it is "
                               "ready or stopped")
    return cm.ClearedReply(out)


def empty(folder: Path) -> int:
    """Remove every rank's entries under an instance's folder; the bytes freed. The weights'
    hashes (weights.json) stay: they are no cache of prompts."""
    freed = 0
    try:
        ranks = [p for p in folder.iterdir() if p.name.startswith("rank") and p.is_dir()]
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise CommandError(f"cannot read {folder}: {e.strerror or e}") from None
    for rank in ranks:
        freed += sum(f.stat().st_size for f in rank.rglob("*") if f.is_file())
        shutil.rmtree(rank, ignore_errors=True)
    return freed
