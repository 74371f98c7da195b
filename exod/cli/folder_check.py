"""`exod check`'s words for exod's folders that are wider than their documented modes
(docs/service.md, "Folders and their modes"): those that exist on this host for this config, as
the daemon run from it by the caller would use them. exod never widens or narrows a folder
that exists (it may be shared); this is where it says so. And for the prompt cache's folders
of an exod from before DIR/ID/NAME, which nothing reads or removes any more."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

from exod import paths
from exod.config.schema import Config
from exod.daemon.cache_owner import LOCK, base_folder
from exod.hub import cache as hub_cache
from exod.models._io import STAMP_NAME


def lines(cfg: Config) -> list[str]:
    seen: set[Path] = set()
    out = []
    for folder, mode in folders(cfg):
        if folder in seen:
            continue
        seen.add(folder)
        said = paths.wider(folder, mode)
        if said is not None:
            out.append(said)
    return out


def old_layout(cfg: Config) -> list[str]:
    """DIR/NAME of this config's instances as an exod before DIR/ID/NAME kept them: a folder
    of `rank*` folders with no lock of a daemon's own in it."""
    out = []
    for inst in cfg.instances.values():
        if inst.prompt_cache_disk_bytes <= 0:
            continue
        old = base_folder(inst, os.environ, cfg.path).parent / inst.name
        if old.is_dir() and not old.is_symlink() and not (old / LOCK).exists() and \
                any(p.name.startswith("rank") for p in _subfolders(old)):
            out.append(f"{old} holds the prompt cache of an older exod, which nothing reads "
                       f"now (this one keeps {inst.name}'s in "
                       f"{base_folder(inst, os.environ, cfg.path) / inst.name}): remove it")
    return out


def folders(cfg: Config) -> Iterator[tuple[Path, int]]:
    """(folder, its documented mode) for each of exod's folders this config uses."""
    env, euid = os.environ, os.geteuid()
    own = paths.cache_dir()
    yield own, paths.PRIVATE
    for p in _subfolders(own):  # a prepared model (the demo's) is readable, as a hub's are
        yield p, paths.READABLE if (p / STAMP_NAME).exists() else paths.PRIVATE
    state = paths.state_dir()
    systemd_made = "STATE_DIRECTORY" in env or state == paths.SYSTEM_STATE
    yield state, 0o750 if systemd_made else paths.PRIVATE
    runtime = cfg.control.socket.parent
    shared = cfg.control.group is not None or "RUNTIME_DIRECTORY" in env or \
        runtime == paths.SYSTEM_RUNTIME_DIR
    yield runtime, 0o750 if shared else paths.PRIVATE
    for inst in cfg.instances.values():
        if inst.prompt_cache_disk_bytes > 0:
            base = base_folder(inst, env, cfg.path)
            if inst.prompt_cache_dir is None:  # the default: exod's; a configured one may be
                yield base.parent, paths.PRIVATE  # the operator's, shared with others
            yield base, paths.PRIVATE
            mine = base / inst.name
            yield mine, paths.PRIVATE
            for rank in _subfolders(mine):
                yield rank, paths.PRIVATE
                yield from ((p, paths.PRIVATE) for p in _subfolders(rank))
    hub = cfg.hub.cache or hub_cache.default_cache(env, euid)
    refs = {ref for inst in cfg.instances.values() for ref in (inst.hub, inst.draft_hub)
            if ref is not None}
    if refs:
        yield hub, paths.READABLE
    for ref in sorted(refs, key=str):
        repo = hub_cache.repo_dir(hub, ref)
        if hub_cache.repo_problem(hub, ref) is not None:
            continue  # not a folder exod reads: `exod check`'s hub lines say so
        yield repo, paths.READABLE
        for name in hub_cache.REPO_FOLDERS:
            yield repo / name, paths.READABLE
        yield from ((p, paths.READABLE) for p in _subfolders(repo / "snapshots"))
    if sys.platform == "darwin":
        from exod.service_files.install import LAUNCHD_LOGS

        yield Path("/") / LAUNCHD_LOGS, paths.READABLE


def _subfolders(folder: Path) -> list[Path]:
    """The real folders in `folder` (no link followed), none when it cannot be read."""
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []
