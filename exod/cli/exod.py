"""`exod`: run the daemon, check a config, prepare the demo model. Never imports mlx."""

from __future__ import annotations

import asyncio
import errno
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from exod import __version__
from exod.core.exits import EXIT_CONFIG

# Seconds granted to exod's own start (logging, the config, the daemon's imports, the first
# spawns: on a loaded host, longer than a short TimeoutStartSec), until the readiness tick runs.
STARTUP_EXTENSION = 15.0

if TYPE_CHECKING:
    from exod.config.schema import Api, Config, Instance
    from exod.daemon.front import Front
    from exod.daemon.supervisor import Supervisor


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="exod")
def main() -> None:
    """exod: local mlx-lm inference as a supervised operating-system service."""


config_option = click.option(
    "-c", "--config", "config", metavar="FILE", default=None,
    help="Config file [default: $EXOD_CONFIG, else /etc/exod/exod.yaml].",
)


@main.command()
@config_option
@click.option("--demo", is_flag=True,
              help="Run the built-in demo model (SmolLM2-135M-Instruct, prepared once and cached).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--log-format", default="auto", show_default=True,
              type=click.Choice(["auto", "human", "journal", "json"]),
              help="auto: journal priority prefixes under systemd, else human.")
def run(config: str | None, demo: bool, log_level: str, log_format: str) -> None:
    """Run the daemon in the foreground (as the service manager does)."""
    from exod.config import ConfigError, load_config, resolve_config_path
    from exod.daemon import logs
    from exod.daemon.manager_notify import ServiceNotifier

    service = ServiceNotifier()
    service.extend_timeout(STARTUP_EXTENSION)  # before anything that takes time
    logs.configure(log_level.upper(), log_format)
    if demo:
        from exod.cli.demo import demo_config

        try:
            path = demo_config()
        except RuntimeError as e:
            service.errno(errno.ENOENT, f"demo model unavailable: {e}")
            raise click.ClickException(str(e)) from None
    else:
        path = resolve_config_path(config)
    def probing(seconds: float) -> None:
        # The first start may probe new layouts before READY: never longer than the start
        # timeout the service manager grants (the unit's TimeoutStartSec is 90 s).
        service.status("checking how the model can be split (probe)")
        service.extend_timeout(seconds + 30)

    try:
        cfg = load_config(path, probing)
    except ConfigError as e:
        from loguru import logger

        for line in str(e).splitlines():  # through the logger: priority <3> in the journal
            logger.error("{}", line)
        hint = "" if demo or path.exists() else " (try `exod run --demo`)"
        logger.error("invalid configuration {}{}: not starting", path, hint)
        service.errno(errno.EINVAL, f"invalid configuration {path}{hint}")
        sys.exit(EXIT_CONFIG)

    from exod.config.safety import public, public_without_token
    from loguru import logger

    if public_without_token(cfg) and not cfg.api.insecure_public:
        why = (f"api.listen {', '.join(public(cfg))} is reachable from other machines but "
               "neither api.token_file nor api.keys is set; set a token file or keys, listen "
               "on 127.0.0.1, or set api.insecure_public: true")
        logger.error("refusing to start: {}", why)
        service.errno(errno.EACCES, f"refusing to start: {why}")
        sys.exit(EXIT_CONFIG)
    from exod.daemon.limits import raise_nofile
    from exod.daemon.ratelog import RateLimitedLog, install_loop_handler
    from exod.daemon.supervisor import Supervisor

    before, after = raise_nofile()
    if after != before:
        logger.debug("open files limit raised from {} to {}", before, after)

    async def serve() -> int:
        install_loop_handler(asyncio.get_running_loop(), RateLimitedLog())
        return await Supervisor(cfg, service, api_server).run()

    sys.exit(asyncio.run(serve()))


def api_server(cfg: Api, daemon: Supervisor) -> Front:
    """The HTTP API the daemon serves (aiohttp is imported only when api.listen is set)."""
    from exod.api.app import ApiServer

    return ApiServer(cfg, daemon)


@main.command()
@config_option
@click.option("--explain", is_flag=True, help="Print every config key with its type and default.")
@click.option("--unit", "units", multiple=True, type=click.Path(path_type=Path), metavar="FILE",
              help="Also check this systemd unit (default: the installed exod.service).")
@click.option("--plist", "plists", multiple=True, type=click.Path(path_type=Path),
              metavar="FILE", help="Also check this launchd plist (default: the installed one).")
@click.option("--system", "system", is_flag=True,
              help="Check the installed service as its user will see it (unit, user, folders, "
                   "config and models readable, its ports and its ranks' free, stop timeout); "
                   "needs root.")
def check(config: str | None, explain: bool, units: tuple[Path, ...],
          plists: tuple[Path, ...], system: bool) -> None:
    """Validate a config file and its includes; exit 78 (EX_CONFIG) if anything is wrong.

    Also warns when the service manager would SIGKILL before exod's termination ladder is
    done (TimeoutStopSec / ExitTimeOut too short), or would signal runners directly (KillMode),
    and about exod's folders wider than their documented modes.
    """
    from exod.config import ConfigError, explain_keys, load_config, resolve_config_path
    from exod.core import ladder
    from exod.service_files import checks

    if explain:
        click.echo(explain_keys())
        return
    if system:
        check_system(Path(config) if config else None)
        return
    path = resolve_config_path(config)
    try:
        cfg = load_config(path)
    except ConfigError as e:
        for line in str(e).splitlines():
            click.echo(line, err=True)
        n = len(e.problems)
        click.echo(f"{path}: {n} problem{'s' if n != 1 else ''}", err=True)
        sys.exit(EXIT_CONFIG)
    from exod.config.safety import ephemeral_overlaps, warnings
    from exod.daemon.rank_addresses import ephemeral_range

    keys_problems(cfg, path)

    from exod.cli import folder_check

    for warning in warnings(cfg) + ephemeral_overlaps(cfg, ephemeral_range()) + \
            folder_check.lines(cfg) + folder_check.old_layout(cfg):
        click.echo(f"warning: {warning}", err=True)
    n = len(cfg.instances)
    worst = ladder.longest(cfg.stop_policies())
    files = [("unit", u) for u in units] + [("plist", p) for p in plists]
    for kind, f in files or checks.installed():
        check_file = checks.check_unit if kind == "unit" else checks.check_plist
        for warning in check_file(f, worst) + checks.check_stamp(f):
            click.echo(f"warning: {warning}", err=True)
    click.echo(f"{path}: OK, {n} instance{'s' if n != 1 else ''}; "
               f"stop ladder worst case {worst:g}s")
    for line in memory_lines(cfg) + cache_lines(cfg) + cluster_lines(cfg):
        click.echo(line)
    from exod.config.model_checks import describe_encoder
    from exod.config.mlx_options import describe as describe_options

    for inst in cfg.instances.values():
        for line in describe_options(inst) + serving_lines(inst) + describe_encoder(inst):
            click.echo(line)


def serving_lines(inst: Instance) -> list[str]:
    """`exod check`'s words for the names an instance answers to, and for an on-demand one its
    idle stop and the keep_alive a request may set."""
    from exod.core.durations import format_duration

    def show(seconds: float) -> str:
        return "never" if math.isinf(seconds) else format_duration(seconds)

    out = []
    if inst.aliases:
        out.append(f"{inst.name}: also answers to {', '.join(inst.aliases)}")
    if inst.on_demand:
        idle = inst.idle_stop_after
        stop = "stays up" if math.isinf(idle) else f"stops after {show(idle)}"
        bounds = inst.keep_alive
        out.append(f"{inst.name}: on demand: {stop} without a request; a request's keep_alive "
                   f"may set that from {show(bounds.min)} to {show(bounds.max)}")
    return out


def keys_problems(cfg: Config, path: Path) -> None:
    """api.keys_file's problems, each at its place, as the config's are (exit 78)."""
    if cfg.api.keys_file is None:
        return
    from exod.config.keys import KeysFileError, read_keys_file

    try:
        read_keys_file(cfg.api.keys_file, list(cfg.instances), taken=cfg.api.keys)
    except KeysFileError as e:
        for p in e.problems:
            click.echo(str(p) if p.file else p.message, err=True)
        n = len(e.problems)
        click.echo(f"{path}: {n} problem{'s' if n != 1 else ''} in api.keys_file", err=True)
        sys.exit(EXIT_CONFIG)


def check_system(config: Path | None) -> None:
    """`exod check --system`: one line per problem with its fix, exit 78 if any."""
    if sys.platform == "darwin":
        raise click.UsageError("--system checks a systemd installation; on macOS use "
                               "`exod check` (it checks the installed plist)")
    from exod.service_files import steps, system_check

    problems, summary = system_check.check_installed(config, steps.run)
    for p in problems:
        click.echo(p.line(), err=True)
    if problems:
        n = len(problems)
        click.echo(f"installed service: {n} problem{'s' if n != 1 else ''}", err=True)
        sys.exit(EXIT_CONFIG)
    click.echo(summary)


def memory_lines(cfg: Config) -> list[str]:
    """Each instance's memory estimate per local rank, and what this host has available."""
    from exod.core.sizes import format_size
    from exod.daemon.memory_check import describe
    from exod.daemon.procinfo import available_bytes
    from exod.daemon.launch import plan_shards

    from exod.cli import hub_check

    lines, estimate = hub_check.lines(cfg)
    lines += [line for inst in estimate
              for line in describe(inst, plan_shards(inst), cfg.node.name,
                                   cfg.defaults.memory_headroom)]
    available = available_bytes()
    if lines and available is not None:
        lines.append(f"available now: {format_size(available)} (less memory_headroom "
                     f"{format_size(cfg.defaults.memory_headroom)})")
    return lines


def cluster_lines(cfg: Config) -> list[str]:
    """What this node will announce to its cluster (with cluster.key_file set), measured now."""
    c = cfg.cluster
    if c.key_file is None:
        return []
    if not c.announce:
        return ["cluster: announce is false: this node neither announces itself nor looks for "
                "others"]
    import os

    from exod.cli.cluster_view import describe_node
    from exod.core.listen import parse_listen
    from exod.daemon.cluster import self_node
    from exod.hub.cache import default_cache
    from exod.secret_file import KEY_BYTES, read_secret
    from exod.wire.announce import cluster_id

    ident = self_node.node_id(cfg, create=False) or "(made at its first start)"
    api_port = parse_listen(cfg.api.listen[0])[1] if cfg.api.listen else 0
    hub = cfg.hub.cache or default_cache(os.environ, os.geteuid())
    info = self_node.measure(cfg, hub, ident, api_port, parse_listen(c.listen)[1])
    how = ("mDNS" if c.mdns else "no mDNS") + (f" and {len(c.peers)} seed peer(s)" if c.peers
                                               else "")
    lines = [f"cluster {cluster_id(read_secret(c.key_file, KEY_BYTES))}: this node announces "
             f"({how}):", *describe_node(info)]
    if c.test_memory is not None:
        lines.append("  (memory from cluster.test_memory: FOR TESTS ONLY)")
    return lines


def cache_lines(cfg: Config) -> list[str]:
    """Each instance's prompt cache budgets: RAM, and disk with its folder and the free space
    of the filesystem it is on."""
    import os
    import shutil

    from exod.config.mlx_options import CACHE_KEYS, idle_cache_keys, turn_reason
    from exod.core.sizes import format_size
    from exod.daemon.cache_owner import prompt_cache_folder

    lines = []
    for inst in cfg.instances.values():
        turns = turn_reason(inst)
        if turns is not None:
            lines.append(f"prompt cache of {inst.name}: none (served by turns: {turns})")
            continue
        idle = idle_cache_keys(inst)
        if idle is not None and idle[0] == CACHE_KEYS:
            lines.append(f"prompt cache of {inst.name}: none ({idle[1]})")
            continue
        ram = format_size(inst.prompt_cache_bytes) if inst.prompt_cache_bytes else "off"
        if idle is not None or not inst.prompt_cache_disk_bytes:
            lines.append(f"prompt cache of {inst.name}: RAM {ram}, disk off"
                         + (f" ({idle[1]})" if idle is not None else ""))
            continue
        folder = prompt_cache_folder(inst, os.environ, cfg.path)
        where = next((p for p in (folder, *folder.parents) if p.exists()), folder)
        try:
            free = f", {format_size(shutil.disk_usage(where).free)} free there now"
        except OSError:
            free = ""
        each = " on each rank" if inst.shards > 1 else ""
        lines.append(f"prompt cache of {inst.name}: RAM {ram}, disk "
                     f"{format_size(inst.prompt_cache_disk_bytes)}{each} in {folder}{free}")
    return lines


@main.command("demo")
@click.option("--cache-dir", type=click.Path(path_type=Path), default=None,
              help="Where to keep the prepared model [default: ~/.cache/exod].")
def demo_cmd(cache_dir: Path | None) -> None:
    """Prepare the demo model (once) and print the path of a config that serves it."""
    from exod.cli.demo import demo_config

    try:
        click.echo(demo_config(cache_dir))
    except RuntimeError as e:
        raise click.ClickException(str(e)) from None


from exod.cli.plan import plan  # noqa: E402 (after main)
from exod.cli.service import install, uninstall  # noqa: E402 (after main)

main.add_command(install)
main.add_command(uninstall)
main.add_command(plan)

if __name__ == "__main__":
    main()
