from __future__ import annotations

from typing import TYPE_CHECKING

from exod.config import ConfigDiff, diff, load_config

if TYPE_CHECKING:
    from tests.unit.conftest import ConfigDir

OLD = """\
instances:
  keep: {model: m}
  tweak: {model: m, max_queue: 3}
  drop: {model: m}
"""


def test_added_removed_changed_unchanged(cfg_dir: ConfigDir) -> None:
    old = load_config(cfg_dir.write("old.yaml", OLD))
    new = load_config(cfg_dir.write("new.yaml", """\
        instances:
          tweak: {model: m, max_queue: 4}
          keep: {model: m}
          fresh: {model: m}
          also: {model: m}
        """))
    d = diff(old, new)
    assert d == ConfigDiff(added=("also", "fresh"), removed=("drop",), changed=("tweak",),
                           unchanged=("keep",), daemon_changed=False)
    assert not d.empty


def test_same_config_is_empty(cfg_dir: ConfigDir) -> None:
    path = cfg_dir.write("exod.yaml", OLD)
    d = diff(load_config(path), load_config(path))
    assert d.empty and d.unchanged == ("drop", "keep", "tweak")


def test_moving_an_instance_to_an_include_is_no_change(cfg_dir: ConfigDir) -> None:
    old = load_config(cfg_dir.write("exod.yaml", OLD))
    cfg_dir.write("exod.yaml", """\
        include: d/*.yaml
        instances:
          keep: {model: m}
          drop: {model: m}
        """)
    cfg_dir.write("d/tweak.yaml", "instances:\n  tweak: {model: ../m, max_queue: 3}\n")
    new = load_config(cfg_dir.root / "exod.yaml")
    assert new.instances["tweak"].source != old.instances["tweak"].source
    assert diff(old, new).unchanged == ("drop", "keep", "tweak")


def test_changed_defaults_change_inheriting_instances(cfg_dir: ConfigDir) -> None:
    old = load_config(cfg_dir.write("exod.yaml", OLD))
    new = load_config(cfg_dir.write("exod.yaml", "defaults: {stop: {grace: 1m}}\n" + OLD.replace(
        "keep: {model: m}", "keep: {model: m, stop: {grace: 10s}}")))
    d = diff(old, new)
    assert d.changed == ("drop", "tweak") and d.unchanged == ("keep",)


def test_control_socket_change_is_flagged(cfg_dir: ConfigDir) -> None:
    old = load_config(cfg_dir.write("exod.yaml", "control: {socket: a.sock}\n" + OLD))
    new = load_config(cfg_dir.write("exod.yaml", "control: {socket: b.sock}\n" + OLD))
    d = diff(old, new)
    assert d.daemon_changed and d.empty
