"""The daemon-level `cluster:` section: defaults, a good section, and each refusal at its place."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from exod.config import ConfigError, load_config
from exod.config.schema import DEFAULT_CLUSTER_PORT
from exod.core.listen import parse_peer

if TYPE_CHECKING:
    from tests.unit.conftest import ConfigDir


def key_file(cfg_dir: ConfigDir, mode: int = 0o600, text: str = "k" * 32) -> str:
    path = cfg_dir.root / "cluster.key"
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


def test_no_section_means_no_cluster(cfg_dir: ConfigDir) -> None:
    c = load_config(cfg_dir.write("exod.yaml", "{}\n")).cluster
    assert c.key_file is None and c.announce and c.mdns and c.peers == ()
    assert c.listen == f"0.0.0.0:{DEFAULT_CLUSTER_PORT}" and c.test_memory is None


def test_a_whole_section_loads(cfg_dir: ConfigDir) -> None:
    key = key_file(cfg_dir)
    c = load_config(cfg_dir.write("exod.yaml", f"""\
        cluster:
          key_file: {key}
          mdns: false
          peers: [10.0.0.2, "10.0.0.3:6000", "[fd00::4]:7000", "[fd00::5]"]
          listen: "0.0.0.0:0"
          interval: 500ms
          peer_timeout: 3s
          test_memory: 8GiB
        """)).cluster
    assert str(c.key_file) == key and not c.mdns
    assert [parse_peer(p, 52416) for p in c.peers] == [
        ("10.0.0.2", 52416), ("10.0.0.3", 6000), ("fd00::4", 7000), ("fd00::5", 52416)]
    assert (c.interval, c.peer_timeout, c.test_memory) == (0.5, 3.0, 8 * 2**30)


@pytest.mark.parametrize("body, where, fragment", [
    ("key_file: KEY_OPEN", "2:13: cluster.key_file", "a secret must be closed to other users"),
    ("key_file: KEY_SHORT", "2:13: cluster.key_file", "fewer than 16 bytes"),
    ("peers: [a, 'b:0']", "2:14: cluster.peers[1]", "the port from 1 to 65535"),
    ("peers: ['a b']", "2:11: cluster.peers", "does not match"),
    ("listen: nowhere", "2:11: cluster.listen", "does not match"),
    ("interval: 0s", "2:13: cluster.interval", "at least 100ms"),
    ("test_memory: -1", "2:16: cluster.test_memory", ""),
    ("zzz: 1", "2:3: cluster.zzz", "unknown key"),
])
def test_refusals_name_file_line_and_column(cfg_dir: ConfigDir, body: str, where: str,
                                            fragment: str) -> None:
    body = body.replace("KEY_OPEN", key_file(cfg_dir, 0o644))
    if "KEY_SHORT" in body:
        short = cfg_dir.root / "short.key"
        short.write_text("tooshort")
        os.chmod(short, 0o600)
        body = body.replace("KEY_SHORT", str(short))
    main = cfg_dir.write("exod.yaml", f"cluster:\n  {body}\n")
    with pytest.raises(ConfigError) as info:
        load_config(main)
    lines = str(info.value).splitlines()
    assert any(line.startswith(f"{main}:{where}") and fragment in line for line in lines), lines
