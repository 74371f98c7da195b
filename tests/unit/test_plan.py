"""The plan rank 0 sends a group's other ranks before each step, and the group's other
commands: what rank 0 encodes is what they decode, operation for operation and in order;
anything else is refused (a ProtocolError, never another exception)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exod.wire import messages as m
from exod.wire.protocol import FrameDecoder, ProtocolError, from_wire, to_wire
from exod.runner.group import wire
from exod.runner.group.plan import (
    AbortAll, AbortPrefilling, Admit, CancelOp, ClearCacheOp, Op, Plan, Settings, Warm,
)

REQ = m.Generate(id="r1", kind="chat", max_tokens=5, seed=42, stop=["\n"],
                 logit_bias={"3": -100.0}, messages=[{"role": "user", "content": "hi"}])


def round_trip(msg: Any) -> Any:
    (obj,) = FrameDecoder().feed(wire.frame(msg))
    return from_wire(obj, wire.TO_WORKER)


def decode(obj: dict[str, Any]) -> Any:
    return from_wire(obj, wire.TO_WORKER)


def test_a_plan_round_trips_in_order() -> None:
    plan = Plan(ops=[Admit(REQ), CancelOp("r0"), AbortPrefilling(), AbortAll()], keep=3,
                step=True, settings=Settings(8, 1 << 30, 256))
    got = round_trip(plan)
    assert got == plan
    assert got.ops[0].request == REQ and isinstance(got.ops[0].request, m.Generate)
    assert round_trip(Plan()) == Plan()


def test_the_wire_form_names_each_operation() -> None:
    assert to_wire(Plan(ops=[CancelOp("r0"), Admit(m.Generate("r2", "completion", 1, prompt="x"))],
                        step=True)) == {
        "type": "plan", "keep": 0, "step": True, "settings": None,
        "ops": [{"type": "cancel", "id": "r0"},
                {"type": "admit", "request": {
                    "type": "generate", "id": "r2", "kind": "completion", "max_tokens": 1,
                    "temperature": 1.0, "top_p": 1.0, "stop": [], "seed": None,
                    "logit_bias": {}, "messages": None, "prompt": "x", "count_only": False,
                    # the rest of Generate's fields, at their defaults
                    **{k: v for k, v in to_wire(m.Generate("r2", "completion", 1)).items()
                       if k not in ("type", "id", "kind", "max_tokens", "temperature", "top_p",
                                    "stop", "seed", "logit_bias", "messages", "prompt",
                                    "count_only")}},
                 "disk_key": None, "disk_tokens": 0}]}


@pytest.mark.parametrize("msg", [wire.GroupHeartbeat(), wire.GroupShutdown(), wire.Go()])
def test_every_command_round_trips(msg: Any) -> None:
    assert round_trip(msg) == msg
    assert from_wire(to_wire(wire.ShardLoaded()), wire.TO_LEADER) == wire.ShardLoaded()


# ---- every operation, any content ---------------------------------------------------------------
TEXT = st.text(max_size=12)
GENERATE = st.builds(
    m.Generate, id=TEXT, kind=st.sampled_from(["chat", "completion"]),
    max_tokens=st.integers(1, 10**6), temperature=st.floats(0, 2), top_p=st.floats(0, 1),
    stop=st.lists(TEXT, max_size=3), seed=st.none() | st.integers(0, 2**63 - 1),
    logit_bias=st.dictionaries(st.integers(0, 10**5).map(str), st.floats(-100, 100),
                               max_size=3),
    messages=st.none() | st.lists(st.fixed_dictionaries({"role": TEXT, "content": TEXT}),
                                  max_size=3),
    prompt=st.none() | TEXT)
DISK = st.none() | st.tuples(st.text("0123456789abcdef", min_size=32, max_size=32),
                             st.integers(1, 10**6))
OPS: st.SearchStrategy[Op] = st.one_of(
    st.builds(lambda g, d: Admit(g, *(d or (None, 0))), GENERATE, DISK), TEXT.map(CancelOp),
    st.just(AbortPrefilling()), st.just(AbortAll()), st.just(ClearCacheOp()),
    st.lists(st.integers(0, 2**31), max_size=50).map(Warm))
PLANS = st.builds(Plan, ops=st.lists(OPS, max_size=6), keep=st.integers(0, 10**6),
                  step=st.booleans(),
                  settings=st.none() | st.builds(Settings, st.integers(1, 512),
                                                 st.integers(0, 2**40), st.integers(0, 4096)))


@settings(max_examples=200, deadline=None)
@given(plan=PLANS)
def test_any_plan_round_trips(plan: Plan) -> None:
    assert round_trip(plan) == plan


@settings(max_examples=200, deadline=None)
@given(op=OPS)
def test_each_operation_round_trips_alone(op: Op) -> None:
    assert round_trip(Plan(ops=[op])).ops == [op]


# ---- refused ------------------------------------------------------------------------------------
GOOD: dict[str, Any] = {"type": "plan", "ops": [], "keep": 0, "step": True}
GOOD_GEN = to_wire(m.Generate("r", "completion", 1, prompt="x"))


@pytest.mark.parametrize("obj, fragment", [
    ({**GOOD, "extra": 1}, "unknown field(s) extra"),
    ({**GOOD, "keep": -1}, "keep -1 is negative"),
    ({**GOOD, "keep": True}, "plan.keep"),
    ({**GOOD, "step": 1}, "plan.step"),
    ({**GOOD, "ops": {}}, "plan.ops: expected a list"),
    ({**GOOD, "ops": [["cancel", "x"]]}, "plan.ops: expected an object"),
    ({**GOOD, "ops": [{"type": "rm", "id": "x"}]}, "unknown message type 'rm'"),
    ({**GOOD, "ops": [{"type": "cancel", "id": 5}]}, "cancel.id: unexpected value 5"),
    ({**GOOD, "ops": [{"type": "cancel"}]}, "cancel: missing field 'id'"),
    ({**GOOD, "ops": [{"type": "abort_all", "code": "x"}]}, "unknown field(s) code"),
    ({**GOOD, "ops": [{"type": "admit", "request": "x"}]}, "admit.request: expected an object"),
    ({**GOOD, "ops": [{"type": "admit", "request": {"type": "cancel", "id": "x"}}]},
     "unknown message type 'cancel'"),
    ({**GOOD, "ops": [{"type": "admit", "request": {"type": "generate", "id": 1}}]},
     "generate.id"),
    ({**GOOD, "ops": [{"type": "admit"}]}, "admit: missing field 'request'"),
    ({**GOOD, "ops": [{"type": "admit", "request": GOOD_GEN, "disk_key": "ab"}]},
     "disk_key and disk_tokens go together"),
    ({**GOOD, "ops": [{"type": "admit", "request": GOOD_GEN, "disk_tokens": 3}]},
     "disk_key and disk_tokens go together"),
    ({**GOOD, "ops": [{"type": "warm", "tokens": ["x"]}]}, "warm.tokens"),
    ({**GOOD, "settings": {"width": 1}}, "missing field 'cache_bytes'"),
    ({**GOOD, "settings": {"width": 0, "cache_bytes": 0, "prefill_step": 0}},
     "impossible engine settings"),
    ({**GOOD, "settings": {"type": "settings", "width": 1, "cache_bytes": 0,
                           "prefill_step": 0}}, "unknown field(s) type"),
    ({"type": "loaded"}, "unknown message type 'loaded'"),  # not for a worker
    ({"type": "heartbeat", "x": 1}, "unknown field(s) x"),
    ({"ops": []}, "unknown message type None"),
])
def test_a_malformed_plan_is_refused(obj: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ProtocolError) as e:
        decode(obj)
    assert fragment in str(e.value), str(e.value)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=10,
)
OP_OBJECTS = st.fixed_dictionaries(
    {"type": st.sampled_from(["admit", "cancel", "abort_all", "abort_prefilling", "generate",
                              "x"])},
    optional={"id": JSON, "request": JSON | st.fixed_dictionaries(
        {"type": st.just("generate")}, optional={"id": JSON, "kind": JSON,
                                                 "max_tokens": JSON})})


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(OP_OBJECTS | JSON, max_size=4), keep=JSON, step=JSON)
def test_any_object_is_a_plan_or_a_protocol_error(ops: list[Any], keep: Any, step: Any) -> None:
    try:
        plan = decode({"type": "plan", "ops": ops, "keep": keep, "step": step})
    except ProtocolError:
        return
    # What passed the check is exactly what goes back on the wire, typed all the way down.
    assert json.loads(json.dumps(to_wire(plan))) == to_wire(plan)
    assert all(isinstance(op, (Admit, CancelOp, AbortPrefilling, AbortAll)) for op in plan.ops)
