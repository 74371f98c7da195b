"""`exoctl`: the command-line client of a running exod, over its control socket.

Exit codes: 0 success; 1 the daemon refused or the command failed; 3 exod is not running (as
`systemctl status` does); 4 `wait` timed out. Never imports mlx, and starts in well under 0.3 s.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import click

from exod.wire import control as cm
from exod.core.exits import EXIT_NOT_RUNNING
from exod.wire.protocol import ProtocolError, to_wire

EXIT_TIMEOUT = 4


class NotRunning(click.ClickException):
    exit_code = EXIT_NOT_RUNNING


class Client:
    def __init__(self, path: Path, timeout: float | None = 30.0) -> None:
        self.path = path
        self.timeout = timeout

    def stream(self, req: cm.Request, timeout: float | None = None
               ) -> Iterator[cm.Event | cm.Reply]:
        """Send one request; yield each answer line, checked. `timeout` bounds the whole
        exchange (None: the client's default; float('inf'): no bound). Raises TimeoutError."""
        limit = self.timeout if timeout is None else timeout
        deadline = None if limit is None or limit == float("inf") else time.monotonic() + limit
        sock = self._connect(limit if deadline is not None else None)
        with sock, sock.makefile("rwb") as f:
            f.write(json.dumps(to_wire(req, cm.REQUEST_TAG)).encode() + b"\n")
            f.flush()
            while True:
                if deadline is not None:
                    sock.settimeout(max(0.001, deadline - time.monotonic()))
                line = f.readline()
                if not line:
                    return
                yield decode_line(line, req)

    def _connect(self, timeout: float | None) -> socket.socket:
        """A connection to a daemon we trust (see exod.trust), or a ClickException saying why
        not: never a word (let alone the API token) to a socket someone else put there."""
        from exod import trust

        problem = trust.socket_problem(self.path)
        if problem is not None:
            raise click.ClickException(problem)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(str(self.path))
            creds = trust.peer_creds(sock)
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            raise NotRunning(f"exod is not running (no daemon on {self.path})") from None
        except PermissionError:
            sock.close()
            raise click.ClickException(
                f"permission denied on {self.path} (are you in its group?)") from None
        except BaseException:
            sock.close()
            raise
        if creds is not None and creds[0] not in trust.trusted_daemon_uids(self.path):
            sock.close()
            raise click.ClickException(f"the process behind {self.path} runs as uid {creds[0]}, "
                                       "neither you, root nor exod's user: not talking to it")
        return sock

    def call(self, req: cm.Request, timeout: float | None = None) -> cm.Reply:
        for msg in self.stream(req, timeout):
            if not isinstance(msg, cm.EVENT_TYPES):
                return msg
        raise click.ClickException("exod closed the connection without an answer")


def decode_line(line: bytes, req: cm.Request) -> cm.Event | cm.Reply:
    """One line from exod, checked; a ClickException when it is not what this exoctl knows
    (an exod of another version, still running after an upgrade)."""
    try:
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ProtocolError("not a JSON object")
        return cm.decode_line(obj, req)
    except (ValueError, RecursionError, ProtocolError) as e:
        raise click.ClickException(f"exod's answer is not what this exoctl expects ({e}): "
                                   "is exod of another version? (restart it after an "
                                   "upgrade)") from None


def default_socket() -> str:
    """The first candidate that exists (exod.paths.client_socket_candidates)."""
    from exod.paths import client_socket

    return str(client_socket())


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--socket", "socket_path", envvar="EXOD_SOCKET", default=default_socket,
              show_default="/run/exod/control.sock as root, else $XDG_RUNTIME_DIR/exod/",
              metavar="PATH", help="exod's control socket [env: EXOD_SOCKET].")
@click.pass_context
def main(ctx: click.Context, socket_path: str) -> None:
    """Control a running exod daemon."""
    ctx.obj = Client(Path(socket_path))


def complete_instance(ctx: click.Context, param: click.Parameter,
                      incomplete: str) -> list[str]:
    """Shell completion of NAME: the daemon's instances. No daemon, no answer: no completions
    (a completion must never print an error into the shell)."""
    root = ctx.find_root()
    path = root.params.get("socket_path") or default_socket()
    try:
        answer = Client(Path(path), timeout=2.0).call(cm.GetStatus())
        names = [i.name for i in answer.instances] if isinstance(answer, cm.StatusReply) else []
    except Exception:  # noqa: BLE001 -- any failure means "nothing to offer"
        return []
    return [n for n in names if n.startswith(incomplete)]


def name_argument() -> Any:
    return click.argument("name", shell_complete=complete_instance)


R = TypeVar("R")


def ok_or_fail(answer: cm.Event | cm.Reply, expect: type[R]) -> R:
    if isinstance(answer, cm.Failure):
        for p in answer.problems:
            click.echo(p, err=True)
        raise click.ClickException(answer.error)
    if not isinstance(answer, expect):  # cm.decode_line gives each request its own answer
        raise click.ClickException(f"exod answered with {type(answer).__name__}")
    return answer


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the full status as JSON.")
@click.pass_obj
def status(client: Client, as_json: bool) -> None:
    """A table of every instance: state, layers, pids, uptime, restarts, RSS, last exit."""
    answer = ok_or_fail(client.call(cm.GetStatus()), cm.StatusReply)
    if as_json:
        obj = to_wire(answer)
        obj.pop("ok", None)
        click.echo(json.dumps(obj, indent=2))
        return
    from exod.cli.table import render_status

    click.echo(render_status(answer))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the cluster's status as JSON.")
@click.pass_obj
def cluster(client: Client, as_json: bool) -> None:
    """The cluster's nodes: state (member, stale, foreign), last heard, backend, memory, disk,
    models, addresses; every refusal; the links measured between them."""
    answer = ok_or_fail(client.call(cm.GetStatus()), cm.StatusReply)
    if as_json:
        click.echo(json.dumps(to_wire(answer.cluster) if answer.cluster else None, indent=2))
        return
    from exod.cli.cluster_view import render_cluster

    click.echo(render_cluster(answer.cluster))


@main.command()
@name_argument()
@click.pass_obj
def start(client: Client, name: str) -> None:
    """Start NAME (also clears a failed state)."""
    answer = ok_or_fail(client.call(cm.Start(name)), cm.StateReply)
    click.echo(f"{name}: {answer.state}")


@main.command()
@name_argument()
@click.pass_obj
def stop(client: Client, name: str) -> None:
    """Stop NAME through the termination ladder; returns once every runner is gone."""
    answer = ok_or_fail(client.call(cm.Stop(name), timeout=float("inf")), cm.StateReply)
    click.echo(f"{name}: {answer.state}")


@main.command()
@name_argument()
@click.pass_obj
def restart(client: Client, name: str) -> None:
    """Stop NAME through the ladder, then start it again."""
    answer = ok_or_fail(client.call(cm.RestartRequest(name), timeout=float("inf")), cm.StateReply)
    click.echo(f"{name}: {answer.state}")


@main.group()
def cache() -> None:
    """The instances' prompt caches (RAM and disk)."""


@cache.command("clear")
@click.argument("name", required=False, shell_complete=complete_instance)
@click.pass_obj
def cache_clear(client: Client, name: str | None) -> None:
    """Empty the prompt cache of NAME (default: every instance), in RAM and on disk. A ready
    instance's runners clear their own; a stopped one's folder is emptied."""
    answer = ok_or_fail(client.call(cm.ClearCacheRequest(name)), cm.ClearedReply)
    from exod.core.sizes import format_size

    for c in answer.cleared:
        if c.how == "runner":
            click.echo(f"{c.name}: cleared by its runners")
        elif c.how == "files":
            click.echo(f"{c.name}: not running; {format_size(c.freed_bytes)} removed from disk")
        else:
            click.echo(f"{c.name}: not running; nothing removed")
        for note in c.notes:
            click.echo(f"  {note}")


@main.command()
@click.pass_obj
def reload(client: Client) -> None:
    """Re-read the config: start added, stop removed, restart changed; keep the rest."""
    answer = ok_or_fail(client.call(cm.Reload(), timeout=float("inf")), cm.ReloadReply)
    parts = [f"{k}: {', '.join(names)}" for k, names in (
        ("added", answer.added), ("removed", answer.removed), ("changed", answer.changed))
        if names]
    click.echo("reloaded" + (f" ({'; '.join(parts)})" if parts else ", nothing changed"))


@main.command()
@name_argument()
@click.option("--timeout", type=float, default=None, metavar="S",
              help="Give up (exit 4) after S seconds; the instance keeps loading. Also waits "
                   "for exod itself to start, within S.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@click.pass_obj
def wait(client: Client, name: str, timeout: float | None, quiet: bool) -> None:
    """Wait until NAME is ready (exit 0); exit 1 if it fails or is stopped."""
    from exod.cli.progress import ProgressBar

    bar = ProgressBar(enabled=not quiet and sys.stdout.isatty())
    start = time.monotonic()
    try:
        if timeout is not None:
            wait_for_daemon(client, start + timeout)
        limit = float("inf") if timeout is None else max(0.001, start + timeout - time.monotonic())
        for msg in client.stream(cm.Wait(name), timeout=limit):
            if isinstance(msg, cm.ProgressEvent):
                bar.update(msg.instance)
                continue
            bar.finish()
            ok_or_fail(msg, cm.WaitReply)
            if not quiet:
                click.echo(f"{name}: ready")
            return
    except TimeoutError:
        bar.finish()
        click.echo(f"{name}: not ready after {timeout:g}s", err=True)
        sys.exit(EXIT_TIMEOUT)
    finally:
        bar.finish()
    raise click.ClickException("exod closed the connection before an answer")


def wait_for_daemon(client: Client, deadline: float) -> None:
    """Until the control socket answers (exod may still be starting, e.g. preparing the demo
    model); raises TimeoutError at the deadline."""
    while True:
        try:
            client.call(cm.GetStatus(), timeout=max(0.001, deadline - time.monotonic()))
            return
        except NotRunning:
            if time.monotonic() >= deadline:
                raise TimeoutError from None
            time.sleep(0.2)  # polling a socket that does not exist yet: nothing to wait on


@main.command()
@name_argument()
@click.option("-n", "--lines", type=click.IntRange(min=0), default=20, show_default=True,
              metavar="N", help="How many recent lines to show first.")
@click.option("-f", "--follow", is_flag=True, help="Then print new lines as they come.")
@click.option("--rank", type=click.IntRange(min=0), default=None, metavar="R",
              help="Only rank R's lines (default: every rank, merged by time).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
def logs(client: Client, name: str, lines: int, follow: bool, rank: int | None,
         as_json: bool) -> None:
    """A runner's recent output, from the daemon's memory (the last 1000 lines per rank)."""
    req = cm.Logs(name, lines=lines, rank=rank, follow=follow)
    try:
        for msg in client.stream(req, timeout=float("inf") if follow else None):
            if isinstance(msg, cm.LineEvent):
                click.echo(json.dumps(to_wire(msg, cm.EVENT_TAG)) if as_json
                           else format_line(msg))
                continue
            ok_or_fail(msg, cm.DoneReply)
            return
    except KeyboardInterrupt:
        return
    raise click.ClickException("exod closed the connection before an answer")


def format_line(msg: cm.LineEvent) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(msg.time))
    level = "" if msg.level == "INFO" else f"{msg.level}: "
    return f"{stamp} {msg.instance}/{msg.rank} | {level}{msg.text}"


@main.command()
@name_argument()
@click.argument("prompt", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the raw chunks, one JSON per line.")
@click.option("--system", default=None, metavar="TEXT", help="A system message first.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, metavar="N")
@click.option("--temperature", type=click.FloatRange(0, 2), default=0.0, show_default=True,
              metavar="T", help="0 is greedy (as mlx_lm.chat): small models ramble when hot.")
@click.option("--seed", type=int, default=None)
@click.pass_obj
def chat(client: Client, name: str, prompt: str | None, as_json: bool, system: str | None,
         max_tokens: int | None, temperature: float | None, seed: int | None) -> None:
    """Chat with NAME over the HTTP API: answer PROMPT, or without it, talk turn by turn
    (with history) until end of input."""
    from exod.cli.chat import ChatClient, api_from_status, run_chat

    url, token = api_from_status(ok_or_fail(client.call(cm.GetStatus()), cm.StatusReply))
    options = {k: v for k, v in (("max_tokens", max_tokens), ("temperature", temperature),
                                 ("seed", seed)) if v is not None}
    run_chat(ChatClient(url, token, options=options), name, prompt, system, as_json)


@main.command()
@click.argument("name")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@click.pass_obj
def pull(client: Client, name: str, quiet: bool) -> None:
    """Fetch the hub model NAME (hf:ORG/NAME[@REVISION]) into exod's cache ahead of time,
    showing its progress as `ollama pull` does; a download in progress for an instance is
    shared, not repeated, and one stopped midway resumes. A branch or tag is looked up again:
    this is how a cached model is updated."""
    from exod.cli.pull_view import PullView

    view = PullView(name.removeprefix("hf:"), sys.stdout.isatty())
    for msg in client.stream(cm.Pull(name), timeout=float("inf")):
        if isinstance(msg, cm.DownloadEvent):
            view.event(msg)
            if not quiet:
                click.echo(view.take(), nl=False)
            continue
        view.finish(isinstance(msg, cm.PullReply))
        if not quiet:
            click.echo(view.take(), nl=False)
        answer = ok_or_fail(msg, cm.PullReply)
        if not quiet:
            click.echo(f"{name}: commit {answer.commit} at {answer.path}")
        return
    raise click.ClickException("exod closed the connection before an answer")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.pass_obj
def models(client: Client, as_json: bool) -> None:
    """The hub models in exod's cache: size, revisions, the instances that use them and when
    one last did (a request served, a start, a fetch)."""
    answer = ok_or_fail(client.call(cm.Models()), cm.ModelsReply)
    if as_json:
        out = to_wire(answer)
        out.pop("ok", None)
        click.echo(json.dumps(out, indent=2))
        return
    from exod.cli.table import human_duration
    from exod.core.sizes import format_size

    rows = [("MODEL", "SIZE", "REVISIONS", "LAST USE", "INSTANCES")]
    now = time.time()
    for e in answer.models:
        revisions = ", ".join(f"{r}={c[:12]}" for r, c in e.revisions.items()) or \
            ", ".join(c[:12] for c in e.commits) or "-"
        size = format_size(e.size_bytes) + (
            f" ({format_size(e.partial_bytes)} partial)" if e.partial_bytes else "")
        users = ", ".join(f"{i.name} ({i.state})" for i in e.instances) or "-"
        last = "-" if e.last_use is None else f"{human_duration(max(0.0, now - e.last_use))} ago"
        if e.problem:  # not read: a link out of the cache, a file where its folder should be
            size, revisions, last, users = "-", "-", "-", e.problem
        rows.append((f"hf:{e.repo}", size, revisions, last, users))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    click.echo(f"cache: {answer.cache}")
    for r in rows:
        click.echo("  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]))


@main.command()
@click.argument("name")
@click.pass_obj
def rm(client: Client, name: str) -> None:
    """Delete the hub model NAME (hf:ORG/NAME) from exod's cache; refused, naming them, while
    instances run from it."""
    removed = ok_or_fail(client.call(cm.RemoveModel(name)), cm.RemovedReply)
    click.echo(f"{removed.removed}: {removed.detail or 'removed'}")


@main.command()
@click.option("--key", default=None, metavar="K", help="That key's requests only.")
@click.option("--since", default=None, metavar="DURATION",
              help="The records of this long back only, e.g. 7d, 12h (default: every one the "
                   "log holds).")
@click.option("--json", "as_json", is_flag=True, help="Print the sums as JSON.")
@click.pass_obj
def usage(client: Client, key: str | None, since: str | None, as_json: bool) -> None:
    """What each key used, per instance, from exod's usage log: requests, prompt tokens (and
    those taken from the prompt cache), completion tokens, time on the batch."""
    from exod.core.durations import parse_duration

    start = None
    if since is not None:
        try:
            start = time.time() - parse_duration(since)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--since") from None
    answer = ok_or_fail(client.call(cm.UsageRequest(key, start)), cm.UsageReply)
    if as_json:
        out = to_wire(answer)
        out.pop("ok", None)
        click.echo(json.dumps(out, indent=2))
        return
    from exod.cli.usage_view import render_usage

    click.echo(render_usage(answer, since))

from exod.cli.keys import key  # noqa: E402 (after main)

main.add_command(key)

if __name__ == "__main__":
    main()
