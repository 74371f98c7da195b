"""What a reload changes: instances added, removed, changed, unchanged; and what it cannot apply."""

from __future__ import annotations

from dataclasses import dataclass

from exod.config.schema import Config


@dataclass(frozen=True)
class ConfigDiff:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: tuple[str, ...]
    # The control socket is bound once at start-up; a reload cannot move it (caller warns).
    daemon_changed: bool

    @property
    def empty(self) -> bool:
        """Nothing for a reload to do about instances."""
        return not (self.added or self.removed or self.changed)


def diff(old: Config, new: Config) -> ConfigDiff:
    """Compare by instance name; an instance is changed when its dataclass differs.

    `Instance.source` is compare=False, so moving a definition to another file changes nothing.
    Inherited `defaults:` are already folded into each instance, so a change there shows up as
    a change of every instance that inherits it.
    """
    before, after = set(old.instances), set(new.instances)
    common = before & after
    return ConfigDiff(
        added=tuple(sorted(after - before)),
        removed=tuple(sorted(before - after)),
        changed=tuple(sorted(n for n in common if old.instances[n] != new.instances[n])),
        unchanged=tuple(sorted(n for n in common if old.instances[n] == new.instances[n])),
        daemon_changed=old.control.socket != new.control.socket,
    )
