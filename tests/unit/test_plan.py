"""The plan rank 0 sends a group's other ranks before each step: what it encodes is what they
decode, operation for operation and in order; anything else is refused."""

from __future__ import annotations

import pytest

from exod import messages as m
from exod.protocol import ProtocolError
from exod.runner.group.plan import Plan, Settings, decode


def test_a_plan_round_trips_in_order() -> None:
    req = m.Generate(id="r1", kind="chat", max_tokens=5, seed=42, stop=["\n"],
                     logit_bias={"3": -100.0}, messages=[{"role": "user", "content": "hi"}])
    plan = Plan(ops=[("admit", m.to_wire(req)), ("cancel", "r0"), ("abort_prefilling", None),
                     ("abort_all", None)], keep=3, step=True, settings=Settings(8, 1 << 30, 256))
    got = decode(plan.encode())
    assert got.ops == [("admit", req), ("cancel", "r0"), ("abort_prefilling", None),
                       ("abort_all", None)]
    assert (got.keep, got.step, got.settings) == (3, True, Settings(8, 1 << 30, 256))
    assert decode(Plan().encode()) == Plan()


@pytest.mark.parametrize("payload", [
    b"[1", b"[]", b'{"ops": [], "keep": 0, "step": true, "extra": 1}',
    b'{"ops": [], "keep": -1, "step": true}', b'{"ops": [], "keep": true, "step": true}',
    b'{"ops": [], "keep": 0, "step": 1}', b'{"ops": [["cancel", 5]], "keep": 0, "step": true}',
    b'{"ops": [["admit", {"type": "cancel", "id": "x"}]], "keep": 0, "step": true}',
    b'{"ops": [["admit", "x"]], "keep": 0, "step": true}',
    b'{"ops": [], "keep": 0, "step": true, "settings": {"width": 1}}',
])
def test_a_malformed_plan_is_refused(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(payload)
