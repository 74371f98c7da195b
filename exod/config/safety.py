"""Settings that are valid but unsafe: warned about by `exod check`, and (a public API without a
token) refused by `exod run` unless the operator says `api.insecure_public: true`."""

from __future__ import annotations

import ipaddress
import os
import stat

from exod.core.listen import parse_listen
from exod.config.keys import auth_configured
from exod.config.schema import Config


def is_public(listen: str) -> bool:
    """True when `listen` (one address) can be reached from other machines (anything but
    loopback)."""
    if not listen:
        return False
    try:
        host, _ = parse_listen(listen)
    except ValueError:
        return False
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a host name: it may resolve to any interface


def public(cfg: Config) -> list[str]:
    """The addresses of api.listen that other machines can reach."""
    return [a for a in cfg.api.listen if is_public(a)]


def public_without_token(cfg: Config) -> bool:
    return bool(public(cfg)) and not auth_configured(cfg.api)


def control_socket_problem(cfg: Config) -> str | None:
    """control.socket must never name something exod would delete to bind there."""
    path = cfg.control.socket
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISSOCK(st.st_mode):
        return None
    kind = "a symlink" if stat.S_ISLNK(st.st_mode) else (
        "a directory" if stat.S_ISDIR(st.st_mode) else "a file that is not a socket")
    return f"{path} exists and is {kind}: exod would have to remove it; choose another path"


def warnings(cfg: Config) -> list[str]:
    out = []
    if public_without_token(cfg):
        verdict = ("allowed by api.insecure_public" if cfg.api.insecure_public
                   else "`exod run` refuses this unless api.insecure_public is true")
        out.append(f"api.listen {', '.join(public(cfg))} is reachable from other machines and "
                   f"neither api.token_file nor api.keys is set: anyone who reaches it can use "
                   f"the models ({verdict})")
    if cfg.control.mode & 0o002:
        out.append(f"control.mode {cfg.control.mode:04o} lets every user write to the control "
                   "socket (use 0660 and control.group)")
    if "*" in cfg.api.cors_origins and not auth_configured(cfg.api):
        out.append("api.cors_origins '*' without api.token_file or api.keys: any web page the "
                   "user visits can use the models")
    return out


def ephemeral_overlaps(cfg: Config, ephemeral: tuple[int, int]) -> list[str]:
    """Groups whose `port_base` puts a port this host listens on inside its ephemeral range
    (inclusive): an outgoing connection may hold that port as its source port at the moment
    the rank binds it. Valid (the rank then fails with its address in use, and retries), but
    worth moving."""
    first, last = ephemeral
    out = []
    for inst in cfg.instances.values():
        if inst.port_base is None or inst.shards < 2:
            continue
        here = [r for r in range(inst.shards)
                if not inst.hosts or inst.hosts[r].name == cfg.node.name]
        ports = [inst.port_base + r for r in here]
        if 0 in here:
            ports.append(inst.port_base + inst.shards)  # rank 0's control port
        inside = [p for p in ports if first <= p <= last]
        if inside:
            where = f"{inst.source}: " if inst.source else ""
            out.append(f"{where}instances.{inst.name}.port_base: port(s) "
                       f"{', '.join(map(str, inside))} lie in this host's ephemeral port range "
                       f"{first}-{last}, where outgoing connections take their source ports: "
                       "one may be taken when a rank needs it (choose a port_base outside it)")
    return out
