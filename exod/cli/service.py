"""`exod install` and `exod uninstall`: put exod's service files in place (or take them away)
and tell the service manager. The planning lives in exod.service_files; this is the CLI."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from exod.service_files import files, steps
from exod.service_files import install as inst


def _target(target: str | None, user: bool) -> steps.Target:
    return steps.Target(target or ("launchd" if sys.platform == "darwin" else "systemd"), user)


def _plan(t: steps.Target, root: Path) -> list[inst.PlannedFile]:
    exod_bin = inst.exod_binary()
    if t.manager == "launchd":
        return inst.launchd_plan(exod_bin, root, t.user)
    need = inst.needed_paths()
    if t.user:
        return inst.systemd_user_plan(exod_bin, root, Path.home(), inst.tmp_binds(need))
    return inst.systemd_plan(exod_bin, root, inst.home_binds(need), inst.tmp_binds(need))


def _run_all(cmds: list[list[str]], runner: steps.Runner, strict: bool) -> None:
    for argv in cmds:
        code, out = runner(argv)
        shown = " ".join(argv)
        if code == 0:
            click.echo(f"ran       {shown}")
        elif strict:
            raise click.ClickException(f"`{shown}` exited {code}: {out}")
        else:
            click.echo(f"warning: `{shown}` exited {code}: {out}", err=True)


def _is_active(t: steps.Target, runner: steps.Runner) -> bool:
    return t.manager == "systemd" and runner([*t.systemctl, "is-active", "--quiet",
                                              "exod.service"])[0] == 0


target_option = click.option(
    "--target", type=click.Choice(["systemd", "launchd"]), default=None,
    help="Service manager [default: launchd on macOS, else systemd].")
user_option = click.option(
    "--user", is_flag=True,
    help="A per-user service (systemd user unit, launchd LaunchAgent), not a system one.")


@click.command()
@click.option("--dry-run", is_flag=True, help="Print every file and its content; change nothing.")
@target_option
@user_option
@click.option("--root", type=click.Path(path_type=Path), default=Path("/"), show_default=True,
              help="Install under this directory (for packaging); runs no command.")
def install(dry_run: bool, target: str | None, user: bool, root: Path) -> None:
    """Install the service files, then have the manager load them; print what changed.

    A system service needs root, and sudo's path holds neither ~/.local/bin (pipx, uv tool)
    nor a venv's bin: run `sudo "$(command -v exod)" install`.

    \b
    systemd:  /etc/systemd/system/exod.service, /etc/sysusers.d/exod.conf,
              /etc/exod/exod.yaml (kept if present), and for a Python under a home
              /etc/systemd/system/exod.service.d/exod-install-home.conf
    --user:   ~/.config/systemd/user/exod.service, ~/.config/exod/exod.yaml
              (control socket $XDG_RUNTIME_DIR/exod/control.sock)
    Either:   for a Python under /tmp or /var/tmp, exod.service.d/exod-install-tmp.conf
              beside the unit
    launchd:  /Library/LaunchDaemons/io.exod.exod.plist, /etc/exod/exod.yaml,
              the log folder /Library/Logs/exod
    --user:   ~/Library/LaunchAgents/io.exod.exod.plist, ~/.config/exod/exod.yaml
    """
    t = _target(target, user)
    try:
        plan = _plan(t, root)
    except inst.InstallError as e:
        raise click.ClickException(str(e)) from None
    # Commands name the final paths, also under --root (what a post-install step runs).
    sysusers = Path("/", inst.SYSUSERS) if any(p.path == root / inst.SYSUSERS for p in plan) \
        else None
    config = _final_config(t)
    live = root == Path("/") and t.manager == "systemd" and steps.systemd_running(t.user)
    if dry_run:
        for item in plan:
            if item.folder:
                click.echo(f"--- {item.path}/ (folder) mode {item.mode:04o} (only if absent)")
                continue
            note = " (only if absent)" if item.keep_existing else ""
            click.echo(f"--- {item.path} mode {item.mode:04o}{note}")
            click.echo(item.content.rstrip("\n"))
        for cmd in steps.commands_for_root(t, sysusers) if live else []:
            click.echo(f"--- then: {cmd}")
        for line in steps.next_steps(t, config, plan[0].path, False, True):
            click.echo(f"--- {line}")
        return
    try:
        changes = files.write(plan)
    except OSError as e:
        raise click.ClickException(f"{e.filename or ''}: {e.strerror or e}") from None
    for c in changes:
        click.echo(c.line())
    changed = any(c.changed for c in changes)
    if live:
        _run_all(steps.after_install(t, changed, sysusers), steps.run, strict=True)
        for line in files.set_groups(plan, changes):
            click.echo(line)
    elif t.manager == "systemd":
        for cmd in steps.commands_for_root(t, sysusers):
            click.echo(f"then:     {cmd}")
    if not changed:
        click.echo("nothing changed")
    for line in steps.next_steps(t, config, plan[0].path, live and _is_active(t, steps.run),
                                 changed):
        click.echo(line)


@click.command()
@target_option
@user_option
@click.option("--purge", is_flag=True,
              help="Also remove the config, the state and cache folders (prepared models) and "
                   "the exod user.")
def uninstall(target: str | None, user: bool, purge: bool) -> None:
    """Stop exod (through its ladder), disable it and remove the files `exod install` wrote."""
    t = _target(target, user)
    try:
        plan = _plan(t, Path("/"))
    except inst.InstallError as e:
        raise click.ClickException(str(e)) from None
    config = next(p.path for p in plan if p.keep_existing)
    owned = [p.path for p in plan if not p.keep_existing and not p.folder]
    if t.manager == "systemd":  # the drop-ins, written only when they were needed
        owned.append(plan[0].path.parent / inst.TMP_DROPIN)
        if not t.user:
            owned.append(Path("/") / inst.HOME_DROPIN)
    owned = list(dict.fromkeys(owned))
    present = [p for p in owned if p.exists()]
    live = t.manager != "systemd" or steps.systemd_running(t.user)
    if present and live:
        _run_all(steps.before_uninstall(t, present[0]), steps.run, strict=False)
    trees = _purge_trees(t, config) if purge else ()
    changes = files.remove(owned, trees)
    for c in changes:
        click.echo(c.line())
    if present and live:
        _run_all(steps.after_uninstall(t), steps.run, strict=False)
    if purge and t.manager == "systemd" and not t.user:
        _run_all(steps.purge_user(), steps.run, strict=False)
    if not changes:
        click.echo("nothing to remove")
    if not purge and config.exists():
        click.echo(f"kept      {config} (and the state folder; --purge removes them)")


def _final_config(t: steps.Target) -> Path:
    if t.user:
        return (inst.user_dirs(Path.home())[1] if t.manager == "systemd"
                else Path.home() / ".config/exod") / "exod.yaml"
    return Path("/", inst.SYSTEM_CONFIG)


def _purge_trees(t: steps.Target, config: Path) -> tuple[Path, ...]:
    from exod.paths import cache_dir

    if t.user:
        return (config.parent, cache_dir())
    if t.manager == "launchd":
        return (config.parent, Path("/", inst.LAUNCHD_LOGS))
    return (config.parent, Path("/var/lib/exod"), Path("/var/cache/exod"))
