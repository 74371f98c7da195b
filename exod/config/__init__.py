"""Config: YAML files in; a validated, frozen `Config` out, or every problem at once."""

from exod.config.diff import ConfigDiff, diff
from exod.config.durations import format_duration, parse_duration
from exod.config.errors import ConfigError, Problem
from exod.config.explain import explain_keys
from exod.config.load import load_config, resolve_config_path
from exod.config.model_dir import model_layer_count
from exod.config.schema import (
    DEFAULT_API_PORT,
    DEFAULT_CONFIG_PATH,
    Api,
    BackoffPolicy,
    Config,
    Control,
    Defaults,
    Host,
    Instance,
    Node,
    StartLimit,
    StopPolicy,
)

__all__ = [
    "DEFAULT_API_PORT",
    "DEFAULT_CONFIG_PATH",
    "Api",
    "BackoffPolicy",
    "Config",
    "ConfigDiff",
    "ConfigError",
    "Control",
    "Defaults",
    "Host",
    "Instance",
    "Node",
    "Problem",
    "StartLimit",
    "StopPolicy",
    "diff",
    "explain_keys",
    "format_duration",
    "load_config",
    "model_layer_count",
    "parse_duration",
    "resolve_config_path",
]
