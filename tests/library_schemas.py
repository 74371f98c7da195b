"""JSON schemas as agent libraries make them, for the tests of constrained decoding
(tests/unit/test_json_bounds.py, tests/integration/test_agent_tools.py): pydantic's
`model_json_schema()` of instructor-style response models, LangChain's tool schemas
(`convert_to_openai_tool`), and the OpenAI Agents SDK's strict schemas (made by the SDK itself
into tests/data/agents_sdk_schemas.json: the SDK is no test dependency, see
tests/data/make_agents_sdk_schemas.py).

None of them closes its objects or bounds its numbers unless the library does: that is what
exod bounds (exod.runner.serving.json_bounds). Their strings are bounded, through the libraries'
own means (pydantic's `Field(max_length=...)`, LangChain's `Annotated`): a random model does not
close a free string on its own, and no bound exod could set on one would suit every client.
`SMALL` are those whose every document fits in 200 tokens, however a model writes it: a token
is at least a byte, and none of them is over 200 bytes (each holds strings of at most 8
characters, at most 96 bytes escaped; numbers of at most 28).
"""

from __future__ import annotations

import datetime
import enum
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

SDK: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "agents_sdk_schemas.json").read_text())


class Unit(enum.Enum):
    C = "celsius"
    F = "fahrenheit"


class Address(BaseModel):
    city: str = Field(max_length=10)
    zip: int | None = None


class Person(BaseModel):
    """An instructor-style response model: nested models, enums, optional fields, dates."""

    name: str = Field(max_length=10, description="Full name")
    age: int
    score: float
    unit: Unit
    home: Address | None = None
    tags: list[Literal["a", "b", "c"]] = Field(max_length=3)
    born: datetime.date | None = None
    seen: datetime.datetime | None = None


class Scores(BaseModel):
    by_name: dict[str, int] = Field(max_length=2)
    pair: tuple[int, bool]


class Weather(BaseModel):
    """The weather forecast for a city."""

    city: str = Field(max_length=8)
    unit: Unit
    days: int = Field(ge=1, le=14)


class Point(BaseModel):
    x: int
    y: int
    label: Literal["a", "b"] | None = None


class Route(BaseModel):
    start: Point
    end: Point
    speed: int | None = None


def langchain_tools() -> list[dict[str, Any]]:
    """LangChain's own tool schemas: a pydantic model, a decorated function, a strict one."""
    from langchain_core.tools import tool
    from langchain_core.utils.function_calling import convert_to_openai_tool

    @tool
    def add(a: int, b: float, mode: Literal["sum", "max"]) -> float:
        """Add two numbers."""
        return 0.0

    @tool
    def find(name: Annotated[str, Field(max_length=8)], limit: int | None = None) -> str:
        """Find a file by name."""
        return ""

    return [convert_to_openai_tool(Weather), convert_to_openai_tool(add),
            convert_to_openai_tool(find), convert_to_openai_tool(Route, strict=True)]


def all_schemas() -> list[tuple[str, dict[str, Any], bool]]:
    """(what, schema, strict) for every schema here."""
    out = [(f"pydantic {m.__name__}", m.model_json_schema(), False)
           for m in (Person, Scores, Weather, Route)]
    for t in langchain_tools():
        f = t["function"]
        out.append((f"langchain {f['name']}", f["parameters"], bool(f.get("strict"))))
    for kind in ("tools", "outputs"):
        out += [(f"agents sdk {name}", s, True) for name, s in SDK[kind].items()]
    return out


SMALL = ("pydantic Weather", "pydantic Route", "langchain add", "langchain find",
         "langchain Route", "agents sdk get_weather", "agents sdk move", "agents sdk Verdict")


def small_schemas() -> list[tuple[str, dict[str, Any], bool]]:
    return [s for s in all_schemas() if s[0] in SMALL]
