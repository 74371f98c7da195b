"""A request's `keep_alive` (Ollama's API): how long its model stays loaded once no request is in
flight. A duration (`5m`, `1h30m`, or a number of seconds), 0 to stop it then, a negative one
to keep it; in exod, an on-demand instance's idle window, within the operator's bounds
(`instances.<name>.keep_alive: {min, max}`). Pure: the daemon applies the window
(exod.daemon.on_demand)."""

from __future__ import annotations

import math
from typing import Any, Protocol

from exod.core.durations import parse_signed
from exod.core.request_rules import RequestError

NEVER = math.inf


# The same name as exod.config.schema.KeepAliveBounds, which it describes: core imports no config.
class KeepAliveBounds(Protocol):
    """The operator's floor and ceiling (the config's `keep_alive: {min, max}`), in seconds."""

    @property
    def min(self) -> float: ...

    @property
    def max(self) -> float: ...


def parse(raw: Any, param: str = "keep_alive") -> float | None:
    """Seconds (NEVER for a negative value), or None when not set. Numbers are seconds, as
    Ollama reads them; strings are durations, Go's form (`1h30m`, `300ms`) included."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise RequestError(f"`{param}` must be a duration (`5m`, `1h`), a number of seconds, "
                           "0 (stop once idle) or -1 (keep)", param)
    try:
        seconds = parse_signed(raw) if isinstance(raw, str) else float(raw)
    except (ValueError, OverflowError):
        raise RequestError(f"`{param}` {str(raw)[:40]!r} is not a duration: use e.g. 5m, 1h, "
                           "300 (seconds), 0 or -1", param) from None
    if math.isnan(seconds):
        raise RequestError(f"`{param}` is not a number", param)
    return NEVER if seconds < 0 else seconds


def bounded(asked: float, bounds: KeepAliveBounds) -> float:
    """The window an instance gets for `asked`: the operator's floor and ceiling win."""
    return min(max(asked, bounds.min), bounds.max)
