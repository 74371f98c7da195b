"""Writes agents_sdk_schemas.json beside this file: the strict JSON schemas the OpenAI Agents
SDK (`openai-agents`) makes for function tools (`function_schema`, which `@function_tool` uses)
and for an agent's output type (`AgentOutputSchema`), as the tests of exod's constrained
decoding read them (tests/unit/test_json_bounds.py, tests/integration/test_agent_tools.py).
Every string has a maxLength, set through pydantic's own `Field`: a random model does not close
a free string (see those tests).

The SDK is not a test dependency: it brings an MCP server stack (starlette, uvicorn, pyjwt with
cryptography, websockets) that no test needs. Run this with an interpreter that has it:

    python -m venv /tmp/agents && /tmp/agents/bin/pip install openai-agents
    /tmp/agents/bin/python tests/data/make_agents_sdk_schemas.py
"""

from __future__ import annotations

import enum
import json
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Literal

from agents import AgentOutputSchema
from agents.function_schema import function_schema
from pydantic import BaseModel, Field


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


class Address(BaseModel):
    street: str = Field(max_length=16)
    number: int
    city: str | None = Field(default=None, max_length=12)


class Contact(BaseModel):
    name: str = Field(max_length=12)
    age: int
    score: float
    priority: Priority
    home: Address | None
    tags: list[Literal["friend", "work", "family"]] = Field(max_length=3)


class Verdict(BaseModel):
    ok: bool
    reason: str = Field(max_length=8)
    confidence: float


def get_weather(city: Annotated[str, Field(max_length=8)], days: int = 3,
                unit: Literal["c", "f"] = "c") -> str:
    """The weather forecast.

    Args:
        city: The city.
        days: How many days.
        unit: Celsius or Fahrenheit.
    """
    return ""


def add_contact(contact: Contact, notify: bool) -> str:
    """Add a contact to the address book."""
    return ""


def move(x: float, y: float, speed: int | None = None) -> str:
    """Move the cursor."""
    return ""


def main() -> None:
    out = {
        "generator": f"openai-agents {version('openai-agents')}, pydantic {version('pydantic')}",
        "tools": {f.__name__: function_schema(f).params_json_schema
                  for f in (get_weather, add_contact, move)},
        "outputs": {t.__name__: AgentOutputSchema(t).json_schema() for t in (Contact, Verdict)},
    }
    path = Path(__file__).with_name("agents_sdk_schemas.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(path)


if __name__ == "__main__":
    main()
