"""What this node announces of itself (exod.core.nodes.NodeInfo), measured here.

Memory: the host's total (or `cluster.test_memory`, for tests only) and what exod may use of it
(less `defaults.memory_headroom`; on macOS of the GPU's working set). Backend: from the platform,
never by importing mlx. Disk: free bytes where hub models are kept. Models: the hub cache's
snapshots and the instances' own model folders. Addresses: every non-loopback address.
Blocking (file system): the daemon calls it off its loop.
"""

from __future__ import annotations

import os
import platform
import secrets
import shutil
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from exod.config.schema import Config, Instance
from exod.core.nodes import Backend, NodeInfo, NodeModel
from exod.daemon.procinfo import MACOS_WORKING_SET, total_bytes
from exod.hub import cache as hub_cache
from exod.paths import daemon_id, state_dir


def node_id_path(config: Config) -> Path:
    """One id per daemon: daemons of one user share the state folder, so it is named by the
    config file (as the prompt cache's folder is)."""
    return state_dir() / "cluster" / f"node-{daemon_id(config.path)}.id"


def node_id(config: Config, create: bool = True) -> str | None:
    """This daemon's node id: made once, then read from its file (None: none made yet)."""
    path = node_id_path(config)
    try:
        text = path.read_text().strip()
        if text:
            return text
    except OSError:
        pass
    if not create:
        return None
    from exod.paths import make_dirs

    make_dirs(path.parent, 0o700)
    made = secrets.token_hex(8)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(made + "\n")
    os.replace(tmp, path)
    return made


def backend() -> Backend:
    """Metal on a Mac with Apple silicon; CUDA where an NVIDIA device is present and mlx's CUDA
    build is installed; else the CPU (what mlx[cpu] runs on)."""
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return "metal"
    if os.path.exists("/dev/nvidia0") or os.path.exists("/proc/driver/nvidia/version"):
        names = {(d.metadata["Name"] or "").lower() for d in metadata.distributions()}
        if any(n.startswith("mlx-cuda") or n.startswith("mlx_cuda") for n in names):
            return "cuda"
    return "cpu"


def memory(config: Config) -> tuple[int, int]:
    """(total, usable) bytes."""
    total = config.cluster.test_memory
    if total is None:
        total = total_bytes() or 0
    gpu = int(total * MACOS_WORKING_SET) if sys.platform == "darwin" else total
    return total, max(0, gpu - config.defaults.memory_headroom)


def disk_free(folder: Path) -> int:
    """Free bytes for models, where the hub cache is (or its nearest existing parent)."""
    for p in (folder, *folder.parents):
        try:
            return shutil.disk_usage(p).free
        except OSError:
            continue
    return 0


def models(hub_folder: Path, instances: Iterable[Instance]) -> tuple[NodeModel, ...]:
    """Hub snapshots by repository and commit; local models by their folder's name."""
    out = {NodeModel(e.repo, commit) for e in hub_cache.entries(hub_folder)
           if not e.problem for commit in e.commits}
    out |= {NodeModel(i.model.name) for i in instances
            if i.hub is None and i.model.is_dir()}
    return tuple(sorted(out, key=lambda m: (m.name, m.revision)))


def addresses() -> tuple[str, ...]:
    """Every address of this host but loopback and IPv6 link-local ones (they need a zone)."""
    import ifaddr

    out: list[str] = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str):
                if not ip.ip.startswith("127."):
                    out.append(ip.ip)
            elif ip.ip[0] != "::1" and not ip.ip[0].lower().startswith("fe80"):
                out.append(ip.ip[0])
    return tuple(dict.fromkeys(out))


def measure(config: Config, hub_folder: Path, ident: str, api_port: int,
            control_port: int) -> NodeInfo:
    total, usable = memory(config)
    return NodeInfo(
        node_id=ident, name=config.node.name, backend=backend(), memory_total=total,
        memory_usable=usable, disk_free=disk_free(hub_folder),
        models=models(hub_folder, config.instances.values()), addresses=addresses(),
        api_port=api_port, control_port=control_port)
