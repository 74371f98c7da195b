"""`exod check --system`: the installed whole, as the service's user will see it at start.

The unit in place and written by this exod (or a newer one), systemd's loaded copy current, the
service user and group, the runtime and state folders, the config and every model directory
readable by that user through the sandbox, the ports exod and its local ranks listen on free,
and the stop timeout against the ladder. Each problem comes with a one-line fix. Nothing is
started; systemd is asked only read-only questions, through the `steps.Runner` seam, and
ports are tried through the `Bind` seam.
"""

from __future__ import annotations

import os
import shlex
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from exod import __version__
from exod.service_files import checks, steps
from exod.service_files.access import Identity, identity, reach_problem, tree_problem
from exod.service_files.install import exod_command
from exod.service_files.stamp import older, read_stamp
from exod.service_files.unitfile import load_unit

if TYPE_CHECKING:
    from exod.config import Config


@dataclass(frozen=True)
class SystemProblem:
    what: str
    fix: str = ""

    def line(self) -> str:
        return f"problem: {self.what}" + (f"; fix: {self.fix}" if self.fix else "")


def unit_problems(path: Path, runner: steps.Runner, live: bool) -> list[SystemProblem]:
    """The file itself: written by this exod or a newer one, loaded by systemd as it is."""
    out = []
    version = read_stamp(path.read_text())
    if version is not None and older(version):
        out.append(SystemProblem(f"{path} was installed by exod {version}, older than this exod "
                           f"{__version__}",
                           f"{exod_command('install')} && sudo systemctl restart exod"))
    if live:
        code, text = runner(["systemctl", "show", "exod.service", "--property=NeedDaemonReload",
                             "--value"])
        if code == 0 and text.strip() == "yes":
            out.append(SystemProblem("systemd runs an older copy of the unit than the one on disk",
                               "sudo systemctl daemon-reload"))
    return out


def exec_problems(svc: dict[str, str], who: Identity) -> list[SystemProblem]:
    """ExecStart's exod and the interpreter of its #! line, reachable by the service."""
    argv = shlex.split(svc.get("ExecStart", "").lstrip("-@:+!"))
    if not argv:
        return [SystemProblem("the unit has no ExecStart=", exod_command("install"))]
    exe = Path(argv[0])
    if not os.access(exe, os.X_OK):
        return [SystemProblem(f"ExecStart names {exe}, which is not an executable file",
                        "run `exod install` with the exod you mean to run")]
    paths = [exe]
    with open(exe, "rb") as f:
        head = f.readline(4096)
    if head.startswith(b"#!"):
        paths.append(Path(head[2:].split()[0].decode()))
    out = []
    for p in dict.fromkeys(paths + [Path(os.path.realpath(p)) for p in paths]):
        problem = reach_problem(p, who, svc)
        if problem is not None:
            why, _ = problem
            out.append(SystemProblem(f"the service cannot run {exe}: {why}",
                               f"sudo {shlex.quote(str(exe))} install  (adds the read-only "
                               f"binds it needs)"))
            break
    return out


SYSTEM_DIRS = {"RuntimeDirectory": Path("/run"), "StateDirectory": Path("/var/lib")}


def dir_problems(svc: dict[str, str], who: Identity,
                 bases: dict[str, Path] = SYSTEM_DIRS) -> list[SystemProblem]:
    """RuntimeDirectory=/StateDirectory= that exist already: owned by the user, in their mode
    (systemd creates them at start, so absent is fine)."""
    out = []
    for key, base in bases.items():
        mode = int(svc.get(f"{key}Mode", "0755"), 8)
        for name in svc.get(key, "").split():
            d = Path(base, name)
            if not d.is_dir():
                continue
            st = d.stat()
            if st.st_uid != who.uid:
                out.append(SystemProblem(f"{d} belongs to uid {st.st_uid}, not to {who.name}",
                                   f"sudo chown -R {who.name}: {d}"))
            elif stat.S_IMODE(st.st_mode) != mode:
                out.append(SystemProblem(f"{d} has mode {stat.S_IMODE(st.st_mode):04o}, the unit's "
                                   f"{key}Mode= is {mode:04o}", f"sudo chmod {mode:04o} {d}"))
    return out


def config_path(svc: dict[str, str]) -> Path | None:
    argv = shlex.split(svc.get("ExecStart", ""))
    for flag in ("-c", "--config"):
        if flag in argv[:-1]:
            return Path(argv[argv.index(flag) + 1])
    return None


Bind = Callable[[str, int], "str | None"]


def try_bind(host: str, port: int) -> str | None:
    """The real seam: None when (host, port) can be bound now, else why not. SO_REUSEADDR, as
    exod's API and rank 0's control listener bind, so a port in TIME_WAIT counts as free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        return e.strerror or str(e)
    return None


def listeners(cfg: Config) -> list[tuple[str, str]]:
    """(the setting that chose it, HOST:PORT) of every address exod and its ranks on this host
    will bind: api.listen, and for a multi-rank instance with a `port_base` each local rank's
    port and rank 0's control port (exod.daemon.rank_addresses). Ports chosen at each start
    (no `port_base`) are free by construction, so not listed."""
    from exod.daemon.rank_addresses import addresses, host_of

    out = [("api.listen", a) for a in cfg.api.listen]
    for name, inst in sorted(cfg.instances.items()):
        if inst.shards < 2 or inst.port_base is None:
            continue
        addrs = addresses(inst)
        setting = f"instances.{name}.port_base"
        out += [(f"{setting} (rank {r})", a) for r, a in enumerate(addrs.ranks)
                if host_of(inst, r, cfg.node.name) == cfg.node.name]
        if host_of(inst, 0, cfg.node.name) == cfg.node.name:
            out.append((f"{setting} (rank 0's group control)", addrs.control))
    return out


def port_problems(cfg: Config, bind: Bind = try_bind) -> list[SystemProblem]:
    """Every listener's address must be free to bind (asked only while exod is stopped)."""
    out = []
    for setting, listen in listeners(cfg):
        host, _, port = listen.rpartition(":")
        why = bind(host.strip("[]"), int(port))
        if why is None:
            continue
        key = setting.split(" ")[0]
        out.append(SystemProblem(f"{setting} {listen} cannot be bound: {why}",
                           f"free it (`ss -ltnp 'sport = :{port}'` shows who holds it) or "
                           f"change {key}"))
    return out


def config_problems(path: Path, svc: dict[str, str], who: Identity, active: bool,
                    bind: Bind = try_bind) -> tuple[list[SystemProblem], float | None]:
    """The config readable by the service, valid, its models readable, its ports free. Also
    returns the ladder's worst case (None when the config cannot be read)."""
    from exod.config import ConfigError, load_config
    from exod.core.ladder import longest

    problem = reach_problem(path, who, svc)
    out = []
    if problem is not None:
        why, fix = problem
        out.append(SystemProblem(f"config {path}: {why}", fix))
    try:
        cfg = load_config(path)
    except ConfigError as e:
        return out + [SystemProblem(f"config {path} is invalid ({len(e.problems)} problem(s))",
                              f"exod check -c {path}")], None
    for name, inst in sorted(cfg.instances.items()):
        if inst.hub is not None:
            continue  # fetched at its start into hub.cache (checked once, below)
        problem = tree_problem(Path(inst.model), who, svc)
        if problem is not None:
            why, fix = problem
            out.append(SystemProblem(f"instance {name}: model {inst.model}: {why}", fix))
    hub_cache = cfg.hub.cache
    if hub_cache is not None and any(i.hub for i in cfg.instances.values()):
        # The default (the service's StateDirectory) is its own; a configured one may not be.
        problem = reach_problem(hub_cache, who, svc)
        if problem is not None:
            why, fix = problem
            out.append(SystemProblem(f"hub.cache {hub_cache}: {why}", fix))
    ports = [] if active else port_problems(cfg, bind)
    return out + ports, longest(cfg.stop_policies())


def group_exists(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


SYSUSERS_FIX = "sudo systemd-sysusers /etc/sysusers.d/exod.conf"


def user_problems(svc: dict[str, str],
                  lookup: Callable[[str, str | None, list[str]], Identity | None] = identity,
                  has_group: Callable[[str], bool] = group_exists
                  ) -> tuple[Identity | None, list[SystemProblem]]:
    """The unit's User= (root when unset) and Group= exist: the service's identity, or None
    when there is no such user (nothing can be judged as that user then)."""
    user = svc.get("User", "root")
    who = lookup(user, svc.get("Group"), svc.get("SupplementaryGroups", "").split())
    if who is None:
        return None, [SystemProblem(f"the service user {user} does not exist", SYSUSERS_FIX)]
    group = svc.get("Group")
    if group and not has_group(group):
        return who, [SystemProblem(f"the service group {group} does not exist", SYSUSERS_FIX)]
    return who, []


def check_installed(config: Path | None, runner: steps.Runner, bind: Bind = try_bind
                    ) -> tuple[list[SystemProblem], str]:
    """Every problem of the installed system service, and a one-line summary when none."""
    unit_path = next((p for p in checks.SYSTEMD_UNITS if p.exists()), None)
    if unit_path is None:
        return [SystemProblem("no exod.service is installed", exod_command("install"))], ""
    svc = load_unit(unit_path).get("Service", {})
    live = steps.systemd_running(False)
    out = unit_problems(unit_path, runner, live)
    who, more = user_problems(svc)
    out += more
    if who is None:
        return out, ""
    out += exec_problems(svc, who) + dir_problems(svc, who)
    active = live and runner(["systemctl", "is-active", "--quiet", "exod.service"])[0] == 0
    path = config or config_path(svc)
    if path is None:
        return out + [SystemProblem("ExecStart= names no config (-c FILE)",
                              exod_command("install"))], ""
    more, worst = config_problems(path, svc, who, active, bind)
    out += more
    if worst is not None:
        out += [SystemProblem(w) for w in checks.check_unit(unit_path, worst)]
    return out, (f"{unit_path}: OK for user {who.name}; config {path} and its models readable; "
                 f"stop ladder worst case {worst:g}s")
