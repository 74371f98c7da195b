"""The plan rank 0 of a group sends the other ranks before each step (exod.runner.group.lockstep):
the engine operations since the last step, in order, the prompt cache's entry count, and
whether to step. Pure (no mlx): encoded as JSON, and checked field by field when decoded.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from exod import messages as m
from exod.protocol import ProtocolError

OPS = ("admit", "cancel", "abort_prefilling", "abort_all")


@dataclass
class Settings:
    """Rank 0's engine settings: every rank's engine must be the same (a host's own config
    could say otherwise)."""

    width: int
    cache_bytes: int
    prefill_step: int


@dataclass
class Plan:
    ops: list[tuple[str, Any]] = field(default_factory=list)  # (op, argument)
    keep: int = 0  # prompt cache entries after the last step
    step: bool = False
    settings: Settings | None = None  # in the first plan only

    def encode(self) -> bytes:
        obj: dict[str, Any] = {"ops": [[op, arg] for op, arg in self.ops], "keep": self.keep,
                               "step": self.step}
        if self.settings is not None:
            obj["settings"] = dataclasses.asdict(self.settings)
        return json.dumps(obj, separators=(",", ":")).encode()


def decode(payload: bytes) -> Plan:
    """A plan from rank 0, checked: ProtocolError for anything odd."""
    try:
        obj = json.loads(payload)
    except (UnicodeDecodeError, ValueError) as e:
        raise ProtocolError(f"plan is not JSON: {e}") from None
    if not isinstance(obj, dict) or set(obj) - {"ops", "keep", "step", "settings"}:
        raise ProtocolError("plan: unexpected shape")
    keep, step, raw = obj.get("keep"), obj.get("step"), obj.get("ops")
    if not isinstance(keep, int) or not _count(keep) or not isinstance(step, bool) \
            or not isinstance(raw, list):
        raise ProtocolError("plan: bad keep, step or ops")
    plan = Plan(keep=keep, step=step, settings=_settings(obj.get("settings")))
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2 and item[0] in OPS):
            raise ProtocolError(f"plan: bad operation {str(item)[:80]}")
        op, arg = item
        if op == "admit":
            if not isinstance(arg, dict):
                raise ProtocolError("plan: admit takes a request")
            arg = m.decode_to_runner(arg)
            if not isinstance(arg, m.Generate):
                raise ProtocolError("plan: admit takes a generate request")
        elif op == "cancel" and not isinstance(arg, str):
            raise ProtocolError("plan: cancel takes a request id")
        plan.ops.append((op, arg))
    return plan


def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _settings(raw: Any) -> Settings | None:
    if raw is None:
        return None
    names = [f.name for f in dataclasses.fields(Settings)]
    if not isinstance(raw, dict) or sorted(raw) != sorted(names) \
            or not all(_count(raw[k]) for k in names):
        raise ProtocolError("plan: bad settings")
    return Settings(**raw)
