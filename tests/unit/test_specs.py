"""The start-up contracts (exod.wire.specs): what a runner, a fetcher and the probe start from.

- No default or choice list of the config is declared a second time: a spec carries the
  `RunnerOptions` the schema's `Instance` inherits (exod.wire.options), its other fields from
  the config are typed with the schema's own aliases, and no field of a spec has a default of
  its own (walked, not listed, so a new field is checked too).
- Every runner option reaches the runner: an instance with each option away from its default
  (found by walking the schema) gives a spec that comes out of the wire equal.
- A group's facts travel in the spec, not in the environment; children keep at most their
  channel's descriptor on their command line.
- The child's end reads the first frame as its spec, refuses one of another version, and hands
  on the rest.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import socket
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest

from exod.wire import messages as m
from exod.wire import specs
from exod.wire.child_end import ChildEnd
from exod.config.schema import Instance
from exod.wire.options import GrammarLimits, RunnerOptions
from exod.config.validate import field_hints, unwrap
from exod.core.shards import Shard
from exod.daemon.launch import Launcher
from exod.core.hub_ref import HubRef
from exod.wire.protocol import FrameDecoder, ProtocolError, encode, from_wire, to_wire

EXOD = Path(specs.__file__).resolve().parents[1]
SPEC_CLASSES = [c for c in vars(specs).values()
                if isinstance(c, type) and dataclasses.is_dataclass(c)
                and c.__module__ == specs.__name__]


# ---- one declaration of each default and choice ----------------------------------------------
def test_a_runner_s_options_are_the_schema_s_own_class() -> None:
    assert typing.get_type_hints(specs.RunnerSpec)["options"] is RunnerOptions
    assert issubclass(Instance, RunnerOptions)  # an instance's keys include them, once


@pytest.mark.parametrize("cls", SPEC_CLASSES, ids=lambda c: c.__name__)
def test_no_spec_field_declares_a_default_or_a_type_of_its_own(cls: type) -> None:
    """Fields named as the config's keys have the schema's very types (so its choice lists),
    and none of a spec's fields has a default the daemon could leave for the child to fill."""
    instance = field_hints(Instance)
    for f in dataclasses.fields(cls):
        if cls is specs.Verdict:
            continue  # an answer, no config in it
        assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, \
            f"{cls.__name__}.{f.name} has a default"
        if f.name in instance:
            assert field_hints(cls)[f.name] == instance[f.name], f"{cls.__name__}.{f.name}"


def test_no_runner_child_re_declares_a_choice_list_of_the_schema() -> None:
    """The choices of every Literal of the schema, written out in the children's sources, would
    be a second copy (the runner's argv once had `choices=("pipeline", "tensor")`)."""
    choices = {tuple(get_args(unwrap(h)[0])) for cls in (Instance, GrammarLimits)
               for h in field_hints(cls).values() if get_origin(unwrap(h)[0]) is Literal}
    assert ("pipeline", "tensor") in choices
    for path in ("runner/__main__.py", "runner/text/serve.py", "runner/text/options.py",
                 "runner/text/load.py", "runner/text/cache.py", "hub/__main__.py",
                 "runner/split/probe.py", "wire/specs.py", "daemon/launch.py",
                 "wire/child_end.py"):
        tree = ast.parse((EXOD / path).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts):
                values = tuple(e.value for e in node.elts)  # type: ignore[attr-defined]
                assert values not in choices, f"{path}:{node.lineno} repeats {values}"


@pytest.mark.parametrize(("path", "channels"), [
    ("runner/__main__.py", ["--channel-fd", "--zygote-fd"]),  # a runner's, or the zygote's
    ("hub/__main__.py", ["--channel-fd"]), ("runner/split/probe.py", ["--channel-fd"])])
def test_a_child_s_command_line_holds_its_channel_alone(path: str, channels: list[str]) -> None:
    tree = ast.parse((EXOD / path).read_text())
    flags = [a.value for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument"
             for a in n.args if isinstance(a, ast.Constant)]
    assert flags == channels


# ---- every option reaches the runner -----------------------------------------------------------
def other_value(hint: Any, default: Any, meta: typing.Mapping[str, Any]) -> Any:
    """A valid value of a schema field's type, other than `default`."""
    bare, _, _ = unwrap(hint)
    if get_origin(bare) is Literal:
        return next(a for a in get_args(bare) if a != default)
    if dataclasses.is_dataclass(bare):
        return bare(**{f.name: other_value(field_hints(bare)[f.name], getattr(bare(), f.name),
                                           f.metadata) for f in dataclasses.fields(bare)})
    if bare is bool:
        return not default
    if bare is int:
        low = int(meta.get("minimum", 1))
        value = max(low, default + 1) if isinstance(default, int) else max(low, 4096)
        return min(value, int(meta.get("maximum", value)))
    if bare is float:
        return float(default or 0) + 1.5
    if bare is Path:
        return Path("/elsewhere")
    if get_origin(bare) is tuple and get_args(bare) == (Path, ...):
        return (Path("/elsewhere/a"), Path("/elsewhere/b"))
    raise AssertionError(f"a new kind of runner option: {hint!r}; teach this test about it")


def test_every_runner_option_away_from_its_default_reaches_the_runner(tmp_path: Path) -> None:
    hints = field_hints(RunnerOptions)
    changed = {f.name: other_value(hints[f.name], getattr(RunnerOptions(), f.name), f.metadata)
               for f in dataclasses.fields(RunnerOptions)}
    template = {"enable_thinking": False, "nested": [1, 2.5, {"x": None, "y": "z"}]}
    inst = Instance(name="x", model=tmp_path, chat_template_kwargs=template, **changed)
    assert all(getattr(inst, k) != getattr(RunnerOptions(), k) for k in changed)
    launch = Launcher(tmp_path, {}).launch(inst, Shard(0, 1, 0, 4, 4), 1, 3)
    spec = from_wire(to_wire(launch.spec), specs.RUNNER_FIRST)
    assert spec == launch.spec and spec.options == specs.runner_options(inst)
    assert spec.chat_template_kwargs == template  # the `warm` prompts' template reads them
    assert {k: getattr(spec.options, k) for k in changed} == changed
    assert spec.model == tmp_path and spec.width == 3 and spec.group is None


def test_a_group_s_facts_travel_in_the_spec_not_the_environment(tmp_path: Path) -> None:
    inst = Instance(name="g", model=tmp_path, shards=2, backend="ring", peer_timeout=7.0)
    launcher = Launcher(tmp_path, {})
    plan = launcher.prepare(inst, owner="g")
    try:
        launch = launcher.launch(inst, Shard(1, 2, 2, 4, 4), 2, 1, plan)
    finally:
        launcher.release("g")
    spec = from_wire(to_wire(launch.spec), specs.RUNNER_FIRST)
    group = spec.group
    assert group is not None and group.hostfile == tmp_path / "groups" / "g.json"
    assert group.key_file == tmp_path / "groups" / "g.key" and group.key_file.exists()
    assert group.control.startswith("127.0.0.1:") and group.peer_timeout == 7.0
    assert spec.shard == Shard(1, 2, 2, 4, 4)
    assert not {k for k in launch.env if k.startswith("MLX_") or k in (
        "EXOD_GROUP_CONTROL", "EXOD_CLUSTER_KEY_FILE", "OPENBLAS_NUM_THREADS")}
    assert launch.env["EXOD_RANK"] == "1"  # for people and tools only


@pytest.mark.parametrize(("config", "kind"), [
    ({"model_type": "llama"}, "text"), ({"architectures": ["BertModel"]}, "embed"),
    ({"model_type": "llava", "vision_config": {"hidden_size": 8}}, "vision"), (None, "text")])
def test_the_daemon_names_the_kind_of_runner_from_the_model_s_files(
        tmp_path: Path, config: dict[str, Any] | None, kind: str) -> None:
    """The runner takes its path from the spec and never reads the model's files for it."""
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    spec = Launcher(tmp_path, {}).launch(Instance(name="x", model=tmp_path),
                                         Shard(0, 1, 0, 4, 4), 1, 1).spec
    assert isinstance(spec, specs.RunnerSpec) and spec.kind == kind
    assert from_wire(to_wire(spec), specs.RUNNER_FIRST) == spec


@pytest.mark.parametrize("change, why", [
    ({"width": 0}, "width"), ({"heartbeat": 0.0}, "heartbeat"), ({"kind": "sound"}, "kind"),
    ({"shard": Shard(2, 2, 0, 4, 4)}, "shard"), ({"shard": Shard(0, 2, 0, 4, 4)}, "group"),
])
def test_an_impossible_runner_spec_is_refused(tmp_path: Path, change: dict[str, Any],
                                              why: str) -> None:
    good = Launcher(tmp_path, {}).launch(Instance(name="x", model=tmp_path),
                                         Shard(0, 1, 0, 4, 4), 1, 1).spec
    obj = {**to_wire(good), **{k: to_wire(v) if dataclasses.is_dataclass(v) else v
                               for k, v in change.items()}}
    with pytest.raises(ProtocolError, match=why):
        from_wire(obj, specs.RUNNER_FIRST)


def test_a_fetcher_s_spec_and_a_plan_are_told_apart() -> None:
    ask = specs.PlanAsk(version=m.VERSION, ref=HubRef("org/x", "v1"), cache=Path("/c"),
                        commit=None, offline=False, token_file=None, peers=(),
                        cluster_key_file=None)
    got = from_wire(to_wire(ask), specs.FETCHER_FIRST)
    assert type(got) is specs.PlanAsk and got == ask
    fetch = from_wire({**to_wire(ask), "type": "fetch"}, specs.FETCHER_FIRST)
    assert type(fetch) is specs.FetchSpec and fetch.ref == HubRef("org/x", "v1")


# ---- the child's end -----------------------------------------------------------------------------
def child(first: dict[str, type[Any]]) -> tuple[ChildEnd[Any], socket.socket, list[Any],
                                                list[str | None]]:
    ours, theirs = socket.socketpair()
    ours.settimeout(10)
    got: list[Any] = []
    closed: list[str | None] = []
    end: ChildEnd[Any] = ChildEnd(theirs.detach(), first, m.TO_RUNNER)
    end.start(got.append, closed.append)
    (hello,) = FrameDecoder().feed(ours.recv(65536))
    assert m.decode_from_runner(hello) == m.Hello(version=m.VERSION, pid=hello["pid"])
    return end, ours, got, closed


def test_the_first_frame_is_the_spec_and_the_rest_is_handed_on(tmp_path: Path) -> None:
    spec = Launcher(tmp_path, {}).launch(Instance(name="x", model=tmp_path),
                                         Shard(0, 1, 0, 4, 4), 1, 1).spec
    end, parent, got, closed = child(specs.RUNNER_FIRST)
    with parent:
        parent.sendall(encode(to_wire(spec)) + encode(to_wire(m.Cancel("r1"))))
        assert end.spec(10) == spec
        parent.sendall(encode(to_wire(m.Shutdown(1.0))))
        parent.shutdown(socket.SHUT_WR)
        assert end.spec(10) == spec and closed_soon(closed)
    assert got == [m.Cancel("r1"), m.Shutdown(1.0)] and closed == [None]


def closed_soon(closed: list[str | None]) -> bool:
    import time

    deadline = time.monotonic() + 10
    while not closed and time.monotonic() < deadline:
        time.sleep(0.01)  # the channel's thread reports the end: polled, with a bound
    return bool(closed)


@pytest.mark.parametrize("frame, why", [
    ({"type": "shutdown", "drain": 0.0}, "unknown message type 'shutdown'"),
    ({**to_wire(specs.ProbeAsk(version=m.VERSION + 1, layouts=[])), "type": "probe"},
     f"of protocol version {m.VERSION + 1}"),
], ids=["not-a-spec-first", "another-version"])
def test_a_bad_first_frame_ends_the_channel_and_no_spec_comes(frame: dict[str, Any],
                                                              why: str) -> None:
    end, parent, got, closed = child(specs.PROBE_FIRST)
    with parent:
        parent.sendall(encode(frame))
        assert end.spec(10) is None
        assert closed_soon(closed) and why in str(closed[0]) and got == []


def test_giving_up_ends_the_wait_for_a_spec_and_a_late_one_is_no_error(tmp_path: Path) -> None:
    """A runner asked to stop before its spec came stops waiting; the spec that comes after is
    still a spec, not a broken channel."""
    spec = Launcher(tmp_path, {}).launch(Instance(name="x", model=tmp_path),
                                         Shard(0, 1, 0, 4, 4), 1, 1).spec
    end, parent, got, closed = child(specs.RUNNER_FIRST)
    with parent:
        end.give_up()
        assert end.spec(10) is None
        parent.sendall(encode(to_wire(spec)) + encode(to_wire(m.Cancel("r1"))))
        parent.shutdown(socket.SHUT_WR)
        assert closed_soon(closed)
    assert closed == [None] and got == [m.Cancel("r1")]
