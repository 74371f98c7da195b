"""One finished request as the usage log keeps it: a JSON object on a line of its own."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from exod.core.usage.calendar import iso, parse_iso


@dataclass(frozen=True)
class UsageRecord:
    time: float  # epoch seconds at its end; written as ISO 8601 in UTC
    key: str  # the key's name (never its secret)
    instance: str
    model: str  # as the request named it (the instance's name or an alias)
    dialect: str  # chat, completion, messages, responses, ollama_chat, ollama_generate
    status: int  # the answer's HTTP status; 499: the client left; a stream's error: its code
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens: taken from the prompt cache
    completion_tokens: int = 0
    batch_seconds: float = 0.0  # from the runner's first word on it to its end
    duration_seconds: float = 0.0  # from its arrival to its end

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_json(self) -> dict[str, Any]:
        obj = asdict(self)
        obj["time"] = iso(self.time)
        obj["batch_seconds"] = round(self.batch_seconds, 6)
        obj["duration_seconds"] = round(self.duration_seconds, 6)
        return obj

    @classmethod
    def from_json(cls, obj: Any) -> UsageRecord | None:
        """The record a log line holds; None for anything else (a line torn by a crash, a
        line of another version's)."""
        try:
            return cls(time=parse_iso(obj["time"]), key=str(obj["key"]),
                       instance=str(obj["instance"]), model=str(obj.get("model", "")),
                       dialect=str(obj.get("dialect", "")), status=int(obj["status"]),
                       prompt_tokens=int(obj.get("prompt_tokens", 0)),
                       cached_tokens=int(obj.get("cached_tokens", 0)),
                       completion_tokens=int(obj.get("completion_tokens", 0)),
                       batch_seconds=float(obj.get("batch_seconds", 0.0)),
                       duration_seconds=float(obj.get("duration_seconds", 0.0)))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def parse_line(line: bytes | str) -> UsageRecord | None:
    try:
        return UsageRecord.from_json(json.loads(line))
    except (ValueError, RecursionError):
        return None
