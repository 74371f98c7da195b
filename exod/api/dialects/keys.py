"""The keys a dialect's object may hold: each either works, or cannot change the answer with
the value sent (a client's echo of what exod itself returned, a caching hint), or is refused
with a 400 naming it (`messages[1].content[0].citations`). Nothing is dropped without a word.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from exod.api.errors import bad_request

Harmless = Callable[[Any], bool]  # true when the value sent cannot change the answer


def anything(value: Any) -> bool:
    return True


def empty(value: Any) -> bool:
    return value is None or value == [] or value == {} or value == ""


def direct(value: Any) -> bool:
    return value is None or value == {"type": "direct"}


def false(value: Any) -> bool:
    return value is None or value is False


# What a client may send for a key that works only with that value, said in the refusal.
_ACCEPTED: dict[Harmless, str] = {empty: "only an empty value", direct: "only {type: direct}",
             false: "only false"}


def check(obj: Mapping[str, Any], param: str, works: Collection[str],
          harmless: Mapping[str, Harmless] | None = None) -> None:
    for key, value in obj.items():
        if key in works:
            continue
        ok = (harmless or {}).get(key)
        if ok is None:
            raise bad_request(f"`{param}.{key}` is not supported", f"{param}.{key}")
        if not ok(value):
            raise bad_request(f"`{param}.{key}` is not supported here "
                              f"({_ACCEPTED.get(ok, 'see the README')} is accepted)",
                              f"{param}.{key}")
