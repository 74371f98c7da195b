"""The wired-memory limit of Metal (macOS): memory mlx keeps resident for the model, so that
macOS does not page the weights out between tokens. mlx_lm.server sets it to the GPU's
recommended working set; an instance's `wired_limit` sets another figure, or 0 (mlx's own
default: nothing kept wired).

A platform seam: `apply` takes the platform and the mlx module as arguments, so its logic is
unit-tested on Linux, where there is no Metal and it does nothing.
"""

from __future__ import annotations

import sys
from typing import Any

from exod.runner.failures import ModelError


class WiredLimitError(ModelError):
    """The limit cannot be set on this machine: the model cannot be served here (retrying will
    not help)."""


def limit_for(setting: int | None, device_info: dict[str, Any]) -> int | None:
    """The limit to set: `setting`, else the recommended working set; None: nothing to set."""
    recommended = device_info.get("max_recommended_working_set_size")
    if setting is None:
        return int(recommended) if recommended else None
    if recommended and setting > int(recommended):
        raise WiredLimitError(f"wired_limit {setting} bytes is more than this Mac's recommended "
                              f"working set ({int(recommended)} bytes)")
    return setting


def apply(setting: int | None, mx: Any = None, platform: str = sys.platform) -> int | None:
    """Set the limit where there is Metal; the limit set, or None where nothing was."""
    if platform != "darwin":
        return None
    if mx is None:
        import mlx.core as mx
    if not mx.metal.is_available():
        return None
    limit = limit_for(setting, dict(mx.device_info()))
    if limit is not None:
        mx.set_wired_limit(limit)
    return limit
