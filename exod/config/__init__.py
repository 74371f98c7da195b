"""Config: YAML files in; a validated, frozen `Config` out, or every problem at once.

The names below are imported when first used: a runner reads a module or two of them alone
(`warm`, `mlx_options`), and loading the YAML reader, the validator and the checks too would add
a tenth of a second to every runner's start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Eager: `diff` names both a module and its function, and the function must win.
from exod.config.diff import ConfigDiff, diff

if TYPE_CHECKING:
    from exod.config.errors import ConfigError, Problem
    from exod.config.explain import explain_keys
    from exod.config.load import load_config, resolve_config_path
    from exod.config.schema import (
        DEFAULT_API_PORT,
        DEFAULT_CONFIG_PATH,
        Api,
        BackoffPolicy,
        Cluster,
        Config,
        Control,
        Defaults,
        Host,
        Instance,
        Node,
        StartLimit,
        StopPolicy,
    )

_MODULES = {
    "errors": ("ConfigError", "Problem"),
    "explain": ("explain_keys",),
    "load": ("load_config", "resolve_config_path"),
    "schema": ("DEFAULT_API_PORT", "DEFAULT_CONFIG_PATH", "Api", "BackoffPolicy", "Cluster",
               "Config", "Control", "Defaults", "Host", "Instance", "Node", "StartLimit",
               "StopPolicy"),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    "DEFAULT_API_PORT", "DEFAULT_CONFIG_PATH", "Api", "BackoffPolicy", "Cluster", "Config",
    "ConfigDiff",
    "ConfigError", "Control", "Defaults", "Host", "Instance", "Node", "Problem", "StartLimit",
    "StopPolicy", "diff", "explain_keys", "load_config", "resolve_config_path",
]


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
