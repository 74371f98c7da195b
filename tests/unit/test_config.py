"""Loading and validating config files: bad inputs (exact positions), good inputs, includes."""

from __future__ import annotations

import math

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from exod.config import (
    Config,
    ConfigError,
    Problem,
    StopPolicy,
    explain_keys,
    load_config,
    resolve_config_path,
)
from exod.config.checks import check_sharding
from exod.config.schema import DEFAULT_CONFIG_PATH, KeepAliveBounds
from exod.facts.model_dir import model_layer_count

if TYPE_CHECKING:
    from tests.unit.conftest import ConfigDir

MAIN = "exod.yaml"

X = """\
instances:
  x:
    model: m
"""  # a valid instance `x`; cases append keys to it at 4 spaces


def x_with(*lines: str) -> str:
    return X + "".join(f"    {line}\n" for line in lines)


# (id, files {name: text}, (file, line, col, key path), message fragment)
BAD = [
    ("unknown-key-did-you-mean", {MAIN: x_with("autostrat: false")},
     (MAIN, 4, 5, "instances.x.autostrat"), "unknown key 'autostrat'; did you mean 'autostart'?"),
    ("unknown-key-kebab", {MAIN: x_with("max-queue: 3")},
     (MAIN, 4, 5, "instances.x.max-queue"), "did you mean 'max_queue'?"),
    ("unknown-top-key-lists-allowed", {MAIN: "zzz: 1\n"},
     (MAIN, 1, 1, "zzz"),
     "allowed keys: node, control, ready, api, cluster, hub, usage, defaults, include, "
     "instances"),
    ("int-got-string", {MAIN: x_with("shards: two")},
     (MAIN, 4, 13, "instances.x.shards"), "expected an integer or auto, got string 'two'"),
    ("int-got-bool", {MAIN: x_with("max_queue: true")},
     (MAIN, 4, 16, "instances.x.max_queue"), "expected an integer, got boolean true"),
    ("int-got-float", {MAIN: x_with("max_concurrency: 1.5")},
     (MAIN, 4, 22, "instances.x.max_concurrency"), "expected an integer, got number 1.5"),
    ("bool-got-quoted-string", {MAIN: x_with('autostart: "yes"')},
     (MAIN, 4, 16, "instances.x.autostart"),
     "must be one of true, false, 'on-demand'; got string 'yes'"),
    ("on-demand-typo", {MAIN: x_with("autostart: ondemand")},
     (MAIN, 4, 16, "instances.x.autostart"), "did you mean 'on-demand'?"),
    ("never-or-duration", {MAIN: x_with("hang_after: soon")},
     (MAIN, 4, 17, "instances.x.hang_after"), "bad duration 'soon'"),
    ("idle-stop-needs-on-demand", {MAIN: x_with("idle_stop_after: 5m")},
     (MAIN, 4, 22, "instances.x.idle_stop_after"), "applies only to `autostart: on-demand`"),
    ("size", {MAIN: "defaults:\n  memory_headroom: lots\n"},
     (MAIN, 2, 20, "defaults.memory_headroom"), "bad size 'lots'"),
    ("float-got-string", {MAIN: "defaults:\n  backoff:\n    multiplier: fast\n"},
     (MAIN, 3, 17, "defaults.backoff.multiplier"), "expected a number, got string 'fast'"),
    ("float-below-minimum", {MAIN: "defaults:\n  backoff: {jitter: 1.5}\n"},
     (MAIN, 2, 21, "defaults.backoff.jitter"), "must be at most 1, got 1.5"),
    ("str-got-int", {MAIN: "api:\n  listen: 8080\n"},
     (MAIN, 2, 11, "api.listen"), "expected a string, got integer 8080 (quote it)"),
    ("bad-duration", {MAIN: x_with("stop: {grace: abc}")},
     (MAIN, 4, 19, "instances.x.stop.grace"),
     "bad duration 'abc': use e.g. 500ms, 10s, 2m, 1h or a number of seconds"),
    ("negative-duration", {MAIN: "defaults:\n  stop:\n    grace: -5s\n"},
     (MAIN, 3, 12, "defaults.stop.grace"), "must not be negative"),
    ("duration-below-minimum", {MAIN: "defaults:\n  stop:\n    interval: 0\n"},
     (MAIN, 3, 15, "defaults.stop.interval"), "must be at least 10ms, got 0"),
    ("duration-got-bool", {MAIN: "defaults:\n  stall_after: yes\n"},
     (MAIN, 2, 16, "defaults.stall_after"), "expected a duration like 10s, got boolean yes"),
    ("bad-literal", {MAIN: x_with("restart: sometimes")},
     (MAIN, 4, 14, "instances.x.restart"),
     "must be one of 'no', 'on-failure', 'always'; got string 'sometimes'"),
    ("literal-did-you-mean", {MAIN: "defaults:\n  restart: on_failure\n"},
     (MAIN, 2, 12, "defaults.restart"), "did you mean 'on-failure'?"),
    ("literal-yaml-bool-not-allowed", {MAIN: "ready: true\n"},
     (MAIN, 1, 8, "ready"), "must be one of 'daemon', 'instances'; got boolean true"),
    ("bad-instance-name", {MAIN: "instances:\n  -bad: {model: m}\n"},
     (MAIN, 2, 3, "instances.-bad"), "bad instance name '-bad'"),
    ("missing-model-dir", {MAIN: "instances:\n  x: {model: nowhere}\n"},
     (MAIN, 2, 14, "instances.x.model"), "/nowhere does not exist"),
    ("model-dir-without-config-json", {MAIN: "instances:\n  x: {model: empty}\n",
                                        "empty/weights.safetensors": ""},
     (MAIN, 2, 14, "instances.x.model"), "/empty has no config.json"),
    ("model-bad-config-json", {MAIN: "instances:\n  x: {model: bad}\n", "bad/config.json": "{nope"},
     (MAIN, 2, 14, "instances.x.model"), "/bad/config.json is not valid JSON"),
    ("model-config-json-not-object", {MAIN: "instances:\n  x: {model: arr}\n",
                                       "arr/config.json": "[1]"},
     (MAIN, 2, 14, "instances.x.model"), "does not hold a JSON object"),
    ("model-is-a-file", {MAIN: "instances:\n  x: {model: afile}\n", "afile": "x"},
     (MAIN, 2, 14, "instances.x.model"), "is not a directory"),
    ("missing-required-model", {MAIN: "instances:\n  x:\n    shards: 1\n"},
     (MAIN, 2, 3, "instances.x"), "missing required key 'model'"),
    ("instance-with-nothing", {MAIN: "instances:\n  x:\n"},
     (MAIN, 2, 3, "instances.x"), "missing required key 'model'"),
    ("duplicate-key", {MAIN: x_with("shards: 1", "shards: 1")},
     (MAIN, 5, 5, "instances.x.shards"),
     "duplicate key 'shards' (first defined at {d}/exod.yaml:4:5)"),
    ("duplicate-instance-same-file", {MAIN: X + "  x: {model: m}\n"},
     (MAIN, 4, 3, "instances.x"), "duplicate instance 'x' (first defined at {d}/exod.yaml:2:3)"),
    ("duplicate-instance-across-files",
     {MAIN: X + "include: [d/*.yaml]\n", "d/a.yaml": "instances:\n  x: {model: ../m}\n"},
     ("d/a.yaml", 2, 3, "instances.x"),
     "duplicate instance 'x' (first defined at {d}/exod.yaml:2:3)"),
    ("include-file-bad-key",
     {MAIN: X + "include: d/*.yaml\n", "d/a.yaml": "instances: {}\ndefaults: {}\n"},
     ("d/a.yaml", 2, 1, "defaults"), "only `instances:` may be set in an included file"),
    ("include-file-is-list", {MAIN: X + "include: d/*.yaml\n", "d/a.yaml": "- x\n"},
     ("d/a.yaml", 1, 1, ""), "an included file must be a mapping holding `instances:`; got a list"),
    ("include-file-empty", {MAIN: X + "include: d/*.yaml\n", "d/a.yaml": "# nothing yet\n"},
     ("d/a.yaml", 1, 1, ""), "the file is empty"),
    ("include-not-utf8", {MAIN: X + "include: d/*.yaml\n", "d/a.yaml": b"instances: \xff\n"},
     ("d/a.yaml", 0, 0, ""), "cannot read: not UTF-8 text"),
    ("include-item-not-string", {MAIN: X + "include: [1]\n"},
     (MAIN, 4, 11, "include[0]"), "expected a string, got integer 1"),
    ("yaml-syntax-error", {MAIN: "instances:\n  x: [m\n  y: 1\n"},
     (MAIN, 3, 4, ""), "YAML syntax error"),
    ("yaml-tab-indent", {MAIN: "instances:\n\tx: 1\n"},
     (MAIN, 2, 1, ""), "YAML syntax error"),
    ("empty-file", {MAIN: ""}, (MAIN, 1, 1, ""), "the file is empty"),
    ("top-level-list", {MAIN: "- a\n- b\n"},
     (MAIN, 1, 1, ""), "the top level must be a mapping of settings"),
    ("top-level-scalar", {MAIN: "hello\n"}, (MAIN, 1, 1, ""), "got string 'hello'"),
    ("negative-int", {MAIN: x_with("max_queue: -1")},
     (MAIN, 4, 16, "instances.x.max_queue"), "must be at least 0, got -1"),
    ("above-maximum", {MAIN: x_with("shards: 100")},
     (MAIN, 4, 13, "instances.x.shards"), "must be at most 64, got 100"),
    ("section-not-mapping", {MAIN: x_with("stop: 5")},
     (MAIN, 4, 11, "instances.x.stop"), "expected a mapping, got integer 5"),
    ("instances-is-list", {MAIN: "instances:\n  - a\n"},
     (MAIN, 2, 3, "instances"), "expected a mapping of instance name to settings, got a list"),
    ("non-string-key", {MAIN: "instances:\n  123: {model: m}\n"},
     (MAIN, 2, 3, "instances"), "keys must be strings, got integer 123 (quote it: '123')"),
    ("env-bad-name", {MAIN: x_with("env: {1BAD: x}")},
     (MAIN, 4, 11, "instances.x.env.1BAD"), "not a valid environment variable name"),
    ("env-value-list", {MAIN: x_with("env: {A: [1]}")},
     (MAIN, 4, 14, "instances.x.env.A"), "expected a string, got a list"),
    ("env-value-null", {MAIN: x_with("env: {A: }")},
     (MAIN, 4, 13, "instances.x.env.A"), "write '' for an empty value"),
    ("octal-garbage", {MAIN: "control: {mode: rw}\n"},
     (MAIN, 1, 17, "control.mode"), "expected an octal file mode like 0660, got string 'rw'"),
    ("octal-decimal-slip", {MAIN: "control: {mode: 660}\n"},
     (MAIN, 1, 17, "control.mode"), "out of range 0..0777; did you mean 0660 (octal)?"),
    ("pattern", {MAIN: "node: {name: a b}\n"},
     (MAIN, 1, 14, "node.name"), "'a b' does not match"),
    ("internal-key", {MAIN: x_with("name: y")},
     (MAIN, 4, 5, "instances.x.name"), "cannot be set in the file"),
    ("internal-top-key", {MAIN: "path: /x\n"}, (MAIN, 1, 1, "path"), "cannot be set in the file"),
    ("empty-path", {MAIN: "control: {socket: ''}\n"},
     (MAIN, 1, 19, "control.socket"), "expected a path, got an empty string"),
    ("more-ranks-than-layers", {MAIN: x_with("shards: 5")},
     (MAIN, 4, 13, "instances.x.shards"), "5 ranks but the model has only 4 layers"),
    ("tensor-with-layers", {MAIN: x_with("shards: 2", "parallelism: tensor", "layers: [2, 2]")},
     (MAIN, 6, 13, "instances.x.layers"), "tensor parallelism splits every layer"),
    ("multi-host-without-port-base",
     {MAIN: x_with("shards: 2", "hosts: [{name: a, address: 10.0.0.1}, "
                   "{name: b, address: 10.0.0.2}]") + "node: {name: a}\n"},
     (MAIN, 2, 3, "instances.x.port_base"), "is required when ranks run on several hosts"),
    ("hosts-without-this-host",
     {MAIN: x_with("shards: 2", "port_base: 6000", "hosts: [{name: a, address: 10.0.0.1}, "
                   "{name: b, address: 10.0.0.2}]") + "node: {name: c}\n"},
     (MAIN, 6, 12, "instances.x.hosts"), "none is this host (node.name 'c')"),
    ("layers-count", {MAIN: x_with("layers: [2, 2]")},
     (MAIN, 4, 13, "instances.x.layers"), "has 2 entries but shards is 1"),
    ("layers-zero", {MAIN: x_with("layers: [0]")},
     (MAIN, 4, 14, "instances.x.layers[0]"), "must be at least 1, got 0"),
    ("layers-sum", {MAIN: x_with("layers: [3]")},
     (MAIN, 4, 13, "instances.x.layers"), "adds up to 3 but the model has 4 layers"),
    ("hosts-empty", {MAIN: x_with("hosts: []")},
     (MAIN, 4, 12, "instances.x.hosts"), "is empty"),
    ("host-missing-address", {MAIN: x_with("hosts: [{name: a}]")},
     (MAIN, 4, 13, "instances.x.hosts[0]"), "missing required key 'address'"),
    ("port-overlap", {MAIN: x_with("port_base: 5000") + "  y: {model: m, port_base: 5000}\n"},
     (MAIN, 5, 28, "instances.y.port_base"),
     "ports 5000 overlap those of instance 'x' (5000, defined at {d}/exod.yaml:2:3)"),
    ("recursive-alias", {MAIN: "include: &a [*a]\n"},
     (MAIN, 1, 10, "include[0]"), "recursive"),
    ("unknown-tag", {MAIN: x_with("shards: !foo 1")},
     (MAIN, 4, 13, "instances.x.shards"), "cannot read value '1'"),
    ("date-for-string", {MAIN: "api: {listen: 2024-01-01}\n"},
     (MAIN, 1, 15, "api.listen"), "expected a string, got date '2024-01-01'"),
    ("listen-item-not-address", {MAIN: "api: {listen: [127.0.0.1:8000, 11434]}\n"},
     (MAIN, 1, 32, "api.listen[1]"), "expected a string, got integer 11434 (quote it)"),
    ("alias-clash",
     {MAIN: x_with("aliases: [llama3.2]") + "  y: {model: m, aliases: ['llama3.2:latest']}\n"},
     (MAIN, 5, 27, "instances.y.aliases[0]"),
     "'llama3.2:latest' already names instance 'x' (defined at {d}/exod.yaml:2:3) (a name "
     "without a tag is the same name with `:latest`)"),
    ("alias-is-another-name", {MAIN: x_with("aliases: [y]") + "  y: {model: m}\n"},
     (MAIN, 4, 15, "instances.x.aliases[0]"), "'y' already names instance 'y'"),
    ("alias-malformed", {MAIN: x_with("aliases: ['qwen3:8b:q4']")},
     (MAIN, 4, 15, "instances.x.aliases[0]"), "'qwen3:8b:q4' does not match"),
    ("keep-alive-needs-on-demand", {MAIN: x_with("keep_alive: {min: 1m}")},
     (MAIN, 4, 17, "instances.x.keep_alive"), "applies only to `autostart: on-demand`"),
    ("keep-alive-min-over-max",
     {MAIN: x_with("autostart: on-demand", "keep_alive: {min: 1h, max: 5m}")},
     (MAIN, 5, 17, "instances.x.keep_alive"), "min (1h) is more than max (5m)"),
    ("keep-alive-max-not-duration", {MAIN: x_with("keep_alive: {max: forever}")},
     (MAIN, 4, 23, "instances.x.keep_alive.max"), "bad duration 'forever'"),
    ("listen-twice", {MAIN: "api:\n  listen: [127.0.0.1:8000, '127.0.0.1:8000']\n"},
     (MAIN, 2, 28, "api.listen[1]"), "127.0.0.1:8000 is listed twice (also api.listen[0])"),
]


def write_files(d: ConfigDir, files: dict[str, str | bytes]) -> Path:
    for name, text in files.items():
        if isinstance(text, bytes):
            (d.root / name).parent.mkdir(parents=True, exist_ok=True)
            (d.root / name).write_bytes(text)
        else:
            d.write(name, text)
    return d.root / MAIN


def problems_of(path: Path) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return list(info.value.problems)


@pytest.mark.parametrize("files, where, fragment", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input(cfg_dir: ConfigDir, files: dict[str, str | bytes],
                   where: tuple[str, int, int, str], fragment: str) -> None:
    main = write_files(cfg_dir, files)
    file, line, col, key_path = where
    shown = str(cfg_dir.root / file)
    prefix = f"{shown}:{line}:{col}: " if line else f"{shown}: "
    prefix += f"{key_path}: " if key_path else ""
    fragment = fragment.replace("{d}", str(cfg_dir.root))
    lines = [str(p) for p in problems_of(main)]
    assert any(s.startswith(prefix) and fragment in s for s in lines), "\n".join(lines)


def test_missing_main_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: cannot read: No such file or directory"


def test_main_file_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert str(info.value) == f"{tmp_path}: cannot read: Is a directory"


def test_dangling_include_symlink_is_reported(cfg_dir: ConfigDir) -> None:
    main = cfg_dir.write(MAIN, X + "include: d/*.yaml\n")
    (cfg_dir.root / "d").mkdir()
    (cfg_dir.root / "d" / "a.yaml").symlink_to(cfg_dir.root / "gone.yaml")
    [problem] = problems_of(main)
    assert str(problem) == f"{cfg_dir.root}/d/a.yaml: cannot read: No such file or directory"


def test_all_errors_reported_at_once(cfg_dir: ConfigDir) -> None:
    main = cfg_dir.write(MAIN, """\
        node: {name: "bad name"}
        control: {mode: 999}
        ready: maybe
        bogus: 1
        defaults:
          stop: {grace: soon}
        include: [d/*.yaml]
        instances:
          a:
            model: m
            shards: 0
            autostart: 3
          b: {}
          c: {model: m, shards: 5}
        """)
    cfg_dir.write("d/x.yaml", "instances:\n  a: {model: ../m}\napi: {}\n")
    problems = problems_of(main)
    got = [(Path(p.file).name, p.line, p.key_path) for p in problems]
    assert got == [
        ("exod.yaml", 1, "node.name"),
        ("exod.yaml", 2, "control.mode"),
        ("exod.yaml", 3, "ready"),
        ("exod.yaml", 4, "bogus"),
        ("exod.yaml", 6, "defaults.stop.grace"),
        ("exod.yaml", 11, "instances.a.shards"),
        ("exod.yaml", 12, "instances.a.autostart"),
        ("exod.yaml", 13, "instances.b"),
        ("exod.yaml", 14, "instances.c.shards"),
        ("x.yaml", 2, "instances.a"),
        ("x.yaml", 3, "api"),
    ]


def test_error_str_is_one_line_per_problem(cfg_dir: ConfigDir) -> None:
    main = cfg_dir.write(MAIN, "ready: 1\nzzz: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(main)
    text = str(info.value).splitlines()
    assert text == [
        f"{main}:1:8: ready: must be one of 'daemon', 'instances'; got integer 1",
        (f"{main}:2:1: zzz: unknown key 'zzz'; allowed keys: node, control, ready, api, "
         "cluster, hub, usage, defaults, include, instances"),
    ]


# -- good inputs -----------------------------------------------------------------------------


def test_minimal_config(cfg_dir: ConfigDir) -> None:
    config = load_config(cfg_dir.write(MAIN, X))
    assert isinstance(config, Config)
    assert config.path == cfg_dir.root / MAIN
    [x] = config.instances.values()
    assert x.name == "x"
    assert x.source == f"{cfg_dir.root}/exod.yaml:2:3"
    assert x.model == cfg_dir.root / "m"
    assert x.shards == 1 and x.restart == "on-failure" and x.stop == StopPolicy()
    assert config.include == ()


def test_operating_keys(cfg_dir: ConfigDir) -> None:
    [x] = load_config(cfg_dir.write(MAIN, X)).instances.values()
    assert x.always_on and not x.on_demand
    assert x.hang_after == 300 and x.idle_stop_after == math.inf and x.context_tokens == 4096
    text = x_with("autostart: on-demand", "idle_stop_after: 10m", "hang_after: never") + (
        "defaults:\n  memory_headroom: 2GiB\n")
    config = load_config(cfg_dir.write(MAIN, text))
    [x] = config.instances.values()
    assert x.on_demand and not x.always_on
    assert x.idle_stop_after == 600 and x.hang_after == math.inf
    assert config.defaults.memory_headroom == 2 * 2**30
    assert x.keep_alive == KeepAliveBounds(min=0, max=math.inf)  # as Ollama: 0 and -1 work
    text = x_with("autostart: on-demand", "keep_alive: {min: 1m, max: never}")
    [x] = load_config(cfg_dir.write(MAIN, text)).instances.values()
    assert x.keep_alive == KeepAliveBounds(min=60, max=math.inf)
    [x] = load_config(cfg_dir.write(MAIN, x_with("autostart: false"))).instances.values()
    assert x.autostart is False and not x.always_on and not x.on_demand


def test_empty_instances_is_fine(cfg_dir: ConfigDir) -> None:
    config = load_config(cfg_dir.write(MAIN, "instances:\n# none yet\n"))
    assert config.instances == {}


def test_full_config(cfg_dir: ConfigDir) -> None:
    cfg_dir.write("token", "secret\n")
    config = load_config(cfg_dir.write(MAIN, """\
        node: {name: box-1}
        control:
          socket: run/control.sock
          mode: 0600
        ready: instances
        api:
          listen: 0.0.0.0:8000
          token_file: token
        defaults:
          restart: no          # YAML 1.1 reads a bare `no` as false; we take the word
          stop: {grace: 1m30s, drain: 500ms, attempts: 2, interval: 2s, kill_interval: 0.5}
          backoff: {initial: 2s, multiplier: 1.5, max: 5m, jitter: 0, reset_after: 1h}
          start_limit: {burst: 3, interval: 10m}
          stall_after: 90
        instances:
          big:
            model: ~/../..{m}
            shards: 1
            parallelism: tensor
            layers: [4]
            autostart: false
            restart: always
            env: {HF_HUB_OFFLINE: 1, DEBUG: yes, MASK: 0660, EMPTY: ''}
            dtype: bfloat16
            hosts: [{name: box-1, address: 10.0.0.1}]
            port_base: 5000
            backend: mpi
            max_concurrency: 4
            max_queue: 0
        """.replace("{m}", str(cfg_dir.root / "m"))))
    assert config.node.name == "box-1"
    assert config.control.socket == cfg_dir.root / "run" / "control.sock"
    assert config.control.mode == 0o600
    assert config.ready == "instances"
    assert config.api.listen == ("0.0.0.0:8000",)
    assert config.api.token_file == cfg_dir.root / "token"
    d = config.defaults
    assert d.restart == "no"
    assert (d.stop.grace, d.stop.drain, d.stop.attempts, d.stop.kill_interval) == (90, 0.5, 2, 0.5)
    assert (d.backoff.multiplier, d.backoff.max, d.backoff.reset_after) == (1.5, 300, 3600)
    assert (d.start_limit.burst, d.start_limit.interval, d.stall_after) == (3, 600, 90)
    big = config.instances["big"]
    assert big.model == cfg_dir.root / "m"
    assert big.layers == (4,) and big.autostart is False and big.restart == "always"
    assert big.env == {"HF_HUB_OFFLINE": "1", "DEBUG": "yes", "MASK": "0660", "EMPTY": ""}
    assert big.hosts[0].address == "10.0.0.1"
    assert (big.port_base, big.backend, big.dtype, big.max_queue) == (5000, "mpi", "bfloat16", 0)
    assert big.stop == d.stop  # inherited whole


def test_defaults_inherited_with_partial_override(cfg_dir: ConfigDir) -> None:
    config = load_config(cfg_dir.write(MAIN, """\
        defaults:
          restart: always
          stop: {grace: 20s, attempts: 7}
          backoff: {max: 2m}
        instances:
          a: {model: m, stop: {grace: 30s}, restart: "no"}
          b: {model: m}
          c: {model: m, stop: }
        """))
    a, b, c = (config.instances[n] for n in "abc")
    assert a.stop == StopPolicy(grace=30, attempts=7)  # attempts kept from defaults
    assert a.restart == "no"
    assert b.stop == StopPolicy(grace=20, attempts=7) and b.restart == "always"
    assert b.backoff.max == 120 and b.backoff.initial == 1.0
    assert c.stop == b.stop  # `stop:` with nothing under it = no override


def test_include_relative_paths_and_order(cfg_dir: ConfigDir) -> None:
    cfg_dir.model("d/local")
    cfg_dir.write(MAIN, X + "include: [d/*.yaml, e/*.yaml]\n")
    cfg_dir.write("d/b.yaml", "instances:\n  b: {model: local}\n")
    cfg_dir.write("d/a.yaml", "instances:\n  a: {model: ../m}\n")
    cfg_dir.write("d/notes.txt", "not yaml: [")
    cfg_dir.write("d/masked.yaml", "")
    os.remove(cfg_dir.root / "d/masked.yaml")
    (cfg_dir.root / "d/masked.yaml").symlink_to("/dev/null")  # masked, as in systemd
    (cfg_dir.root / "d/sub.yaml").mkdir()  # directories are skipped
    config = load_config(cfg_dir.root / MAIN)  # e/ does not exist: fine
    assert list(config.instances) == ["x", "a", "b"]
    assert config.instances["a"].model == cfg_dir.root / "m"
    assert config.instances["b"].model == cfg_dir.root / "d" / "local"
    assert config.instances["a"].source == f"{cfg_dir.root}/d/a.yaml:2:3"
    assert config.include == ("d/*.yaml", "e/*.yaml")


def test_include_single_string_and_skips_main_file(cfg_dir: ConfigDir) -> None:
    cfg_dir.write(MAIN, X + "include: '*.yaml'\n")
    cfg_dir.write("more.yaml", "instances:\n  y: {model: m}\n")
    config = load_config(cfg_dir.root / MAIN)
    assert sorted(config.instances) == ["x", "y"]


def test_listen_one_address_several_or_none(cfg_dir: ConfigDir) -> None:
    """api.listen: one address (a string, as before), a list served alike, or off."""
    def listen(text: str) -> tuple[str, ...]:
        return load_config(cfg_dir.write(MAIN, X + text)).api.listen

    assert listen("") == ("127.0.0.1:52415",)
    assert listen("api: {listen: '[::1]:8000'}\n") == ("[::1]:8000",)
    assert listen("api: {listen: [127.0.0.1:52415, 127.0.0.1:11434, 127.0.0.1:0, 127.0.0.1:0]}"
                  "\n") == ("127.0.0.1:52415", "127.0.0.1:11434", "127.0.0.1:0", "127.0.0.1:0")
    assert listen("api: {listen: ''}\n") == () == listen("api: {listen: []}\n")


def test_relative_main_path(cfg_dir: ConfigDir, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg_dir.write("etc/" + MAIN, "instances:\n  x: {model: ../m}\ninclude: d/*.yaml\n")
    cfg_dir.write("etc/d/a.yaml", "instances:\n  y: {model: ../../m}\n")
    monkeypatch.chdir(cfg_dir.root)
    config = load_config(Path("etc") / MAIN)
    assert config.path == cfg_dir.root / "etc" / MAIN
    assert config.instances["y"].model == cfg_dir.root / "m"
    assert config.instances["y"].source == "etc/d/a.yaml:2:3"


def test_anchors_and_merge_keys(cfg_dir: ConfigDir) -> None:
    config = load_config(cfg_dir.write(MAIN, """\
        instances:
          a: &base {model: m, max_queue: 3, stop: {grace: 1s}}
          b:
            <<: *base
            max_queue: 5
        """))
    assert config.instances["b"].max_queue == 5
    assert config.instances["b"].stop.grace == 1.0
    assert config.instances["b"].model == cfg_dir.root / "m"


def test_tilde_is_expanded(cfg_dir: ConfigDir, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(cfg_dir.root))
    config = load_config(cfg_dir.write(MAIN, "control: {socket: ~/s.sock}\n"))
    assert config.control.socket == cfg_dir.root / "s.sock"


def test_octal_forms(cfg_dir: ConfigDir) -> None:
    for text, mode in (("0660", 0o660), ("'0660'", 0o660), ("'0o640'", 0o640), ("432", 432)):
        config = load_config(cfg_dir.write(MAIN, f"control: {{mode: {text}}}\n"))
        assert config.control.mode == mode, text


# -- helpers ---------------------------------------------------------------------------------


def test_model_layer_count(cfg_dir: ConfigDir) -> None:
    assert model_layer_count(cfg_dir.root / "m") == 4
    assert model_layer_count(cfg_dir.model("b", {"n_layer": 12})) == 12
    nested = {"text_config": {"num_hidden_layers": 30}}
    assert model_layer_count(cfg_dir.model("c", nested)) == 30
    assert model_layer_count(cfg_dir.model("d", {"num_layers": "x"})) is None
    assert model_layer_count(cfg_dir.root / "missing") is None
    cfg_dir.write("e/config.json", "{bad")
    assert model_layer_count(cfg_dir.root / "e") is None


def test_resolve_config_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXOD_CONFIG", raising=False)
    assert resolve_config_path(None) == DEFAULT_CONFIG_PATH
    monkeypatch.setenv("EXOD_CONFIG", "/srv/exod.yaml")
    assert resolve_config_path(None) == Path("/srv/exod.yaml")
    assert resolve_config_path("/cli.yaml") == Path("/cli.yaml")
    monkeypatch.setenv("EXOD_CONFIG", "")
    assert resolve_config_path(None) == DEFAULT_CONFIG_PATH


def test_check_sharding_is_liftable(cfg_dir: ConfigDir) -> None:
    config = load_config(cfg_dir.write(MAIN, X))
    assert check_sharding(config.instances["x"], config.node.name) == []


def test_explain_keys_covers_the_schema() -> None:
    text = explain_keys()
    for key in ("node.name", "control.mode", "defaults.stop.grace", "instances.<name>.model",
                "instances.<name>.stop.grace", "instances.<name>.hosts[].address", "include"):
        assert f"\n{key}\n" in text, key
    assert "instances.<name>.name" not in text  # internal
    assert "default: from defaults.stop.grace" in text
    assert "octal file mode; default: 0660" in text


@pytest.mark.parametrize("spec,n,message", [
    ({"heads": 4, "kv_heads": 2}, 2, None),
    # Told by config.json alone, before any probe starts.
    ({"hidden": 96, "heads": 6, "kv_heads": 6}, 4,
     "its 6 attention heads do not split across 4 ranks (num_attention_heads in config.json)"),
    # Told by the probe: the runner's own code, run on the family built with no weights.
    ({"heads": 8, "kv_heads": 2}, 4,
     "its 2 key/value heads do not split across 4 ranks (Attention.n_kv_heads = 2)"),
    ({"intermediate": 258, "kv_heads": 4}, 4,
     "mlx-lm's own sharding of this family refuses it: Cannot shard the output of size 258 "
     "across 4 devices. (at mlx_lm/models/llama.py:LINE, in shard)"),
])
def test_a_tensor_layout_that_cannot_work_is_refused_in_words(
        cfg_dir: ConfigDir, spec: dict[str, int], n: int, message: str | None) -> None:
    """Whether a layout works is asked of the code that will run it (a probe subprocess that
    builds the family from config.json with no weights), and the refusal says why in words."""
    from tests.models.tiny import TinySpec

    cfg_dir.model("t", TinySpec(**spec).config())
    main = cfg_dir.write(MAIN, f"instances:\n  t: {{model: t, shards: {n}, "
                               "parallelism: tensor}\n")
    if message is None:
        assert load_config(main).instances["t"].shards == n
        return
    (p,) = problems_of(main)
    assert (p.line, p.col, p.key_path) == (2, 41, "instances.t.parallelism")
    line = re.sub(r"\.py:\d+", ".py:LINE", p.message)  # lines of mlx-lm's code move
    assert line == f"tensor over {n} ranks cannot work for this model: {message}"


def test_a_config_mlx_lm_cannot_build_is_left_to_the_runner(cfg_dir: ConfigDir) -> None:
    """A partial config.json: the probe cannot tell, so the check refuses nothing (the
    runner will report the model's own problem)."""
    cfg_dir.model("f", {"model_type": "llama", "num_hidden_layers": 4})
    main = cfg_dir.write(MAIN, "instances:\n  f: {model: f, shards: 2, parallelism: tensor}\n")
    assert load_config(main).instances["f"].shards == 2


def test_mpi_backend_is_refused_with_the_reason(cfg_dir: ConfigDir) -> None:
    main = cfg_dir.write(MAIN, "instances:\n  x: {model: m, shards: 2, backend: mpi}\n")
    (p,) = problems_of(main)
    assert p.key_path == "instances.x.backend" and "started by mpirun" in p.message
