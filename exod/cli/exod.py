"""`exod`: run the daemon, check a config, prepare the demo model. Never imports mlx."""

from __future__ import annotations

import asyncio
import errno
import sys
from pathlib import Path

import click

from exod import __version__
from exod.core.exits import EXIT_CONFIG


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
    from exod.daemon.service import ServiceNotifier

    logs.configure(log_level.upper(), log_format)
    service = ServiceNotifier()
    if demo:
        from exod.cli.demo import demo_config

        try:
            path = demo_config()
        except RuntimeError as e:
            service.errno(errno.ENOENT, f"demo model unavailable: {e}")
            raise click.ClickException(str(e)) from None
    else:
        path = resolve_config_path(config)
    try:
        cfg = load_config(path)
    except ConfigError as e:
        for line in str(e).splitlines():
            click.echo(line, err=True)
        hint = "" if demo or path.exists() else " (try `exod run --demo`)"
        service.errno(errno.EINVAL, f"invalid configuration {path}{hint}")
        sys.exit(EXIT_CONFIG)

    from exod.daemon.supervisor import Supervisor

    sys.exit(asyncio.run(Supervisor(cfg, service).run()))


@main.command()
@config_option
@click.option("--explain", is_flag=True, help="Print every config key with its type and default.")
def check(config: str | None, explain: bool) -> None:
    """Validate a config file and its includes; exit 78 (EX_CONFIG) if anything is wrong."""
    from exod.config import ConfigError, explain_keys, load_config, resolve_config_path
    from exod.core import ladder

    if explain:
        click.echo(explain_keys())
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
    n = len(cfg.instances)
    worst = max([ladder.worst_case(i.stop) for i in cfg.instances.values()]
                + [ladder.worst_case(cfg.defaults.stop)])
    click.echo(f"{path}: OK, {n} instance{'s' if n != 1 else ''}; "
               f"stop ladder worst case {worst:g}s")


@main.command("demo")
@click.option("--cache-dir", type=click.Path(path_type=Path), default=None,
              help="Where to keep the prepared model [default: ~/.cache/exod].")
def demo_cmd(cache_dir: Path | None) -> None:
    """Prepare the demo model (once) and print its directory and a config that serves it."""
    from exod.cli.demo import demo_config

    try:
        click.echo(demo_config(cache_dir))
    except RuntimeError as e:
        raise click.ClickException(str(e)) from None


if __name__ == "__main__":
    main()
