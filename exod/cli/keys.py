"""`exoctl key new NAME` and `exoctl key hash`: make a key's secret and the entry that names
it in the config (its hash only), with no daemon and no network. The secret is printed once;
exod keeps nothing of it but the hash the operator pastes into api.keys_file or api.keys."""

from __future__ import annotations

import re
import sys

import click

from exod.core.keys import NAME_RE, SCOPES, hash_text, new_secret


def _names(text: str | None, allowed: tuple[str, ...] | None, what: str) -> list[str]:
    items = [x.strip() for x in (text or "").split(",") if x.strip()]
    for x in items:
        if allowed is not None and x not in allowed:
            raise click.BadParameter(f"{x!r} is not a {what}: use {', '.join(allowed)}")
    return items


def entry(name: str, hashed: str, owner: str, scopes: list[str],
          instances: list[str]) -> str:
    """The key's YAML entry, as an item of a list (api.keys_file, api.keys)."""
    lines = [f"- name: {name}"]
    if owner:
        lines.append(f"  owner: {_quoted(owner)}")
    lines += [f"  hash: {hashed}", f"  scopes: [{', '.join(scopes)}]"]
    if instances:
        lines.append(f"  instances: [{', '.join(_quoted(i) for i in instances)}]")
    return "\n".join(lines)


def _quoted(text: str) -> str:
    """As a YAML double-quoted string (JSON's escapes are YAML's)."""
    import json

    return json.dumps(text, ensure_ascii=False)


@click.group()
def key() -> None:
    """Make API keys (see docs/keys.md)."""


@key.command("new")
@click.argument("name")
@click.option("--scopes", default="infer", show_default=True, metavar="LIST",
              help="Comma-separated: infer, manage, admin.")
@click.option("--owner", default="", metavar="TEXT", help="Whose key it is.")
@click.option("--instances", default=None, metavar="LIST",
              help="Comma-separated instance names it may use [default: every instance].")
def key_new(name: str, scopes: str, owner: str, instances: str | None) -> None:
    """Make a key named NAME: print its secret (once: exod keeps only its hash) and its
    entry for api.keys_file (or api.keys); then `exoctl reload`."""
    if not re.match(NAME_RE, name):
        raise click.BadParameter(f"{name!r}: use 1 to 64 letters, digits, '.', '_' or '-'",
                                 param_hint="NAME")
    chosen = _names(scopes, SCOPES, "scope")
    if not chosen:
        raise click.BadParameter("name at least one scope", param_hint="--scopes")
    secret = new_secret()
    click.echo("# The secret, shown only now: give it to the key's user, who sends it as "
               "`Authorization: Bearer SECRET` (or as an API key in any client).")
    click.echo(secret)
    click.echo("# Its entry, for api.keys_file (a list of these) or under api.keys; then "
               "`exoctl reload`:")
    click.echo(entry(name, hash_text(secret), owner, chosen, _names(instances, None, "")))


@key.command("hash")
def key_hash() -> None:
    """Print the `hash:` of the secret read from standard input (its first line)."""
    line = sys.stdin.readline().strip()
    if not line:
        raise click.ClickException("no secret on standard input")
    click.echo(hash_text(line))
