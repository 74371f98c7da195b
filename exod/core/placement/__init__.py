"""Placement: which nodes run an instance's ranks, and which layers each holds (`place`).

Pure, as the rest of core: what a model costs a rank (`costs`, from the safetensors headers
that exod.core.memory reads), the layer split by room (`split`), the chain of nodes by link
speed (`chain`), the planner (`planner`), what it decides (`placed`) and its refusal in words
(`words`). docs/sharding.md, "Placement".
"""

from exod.core.placement.costs import ModelCosts, model_costs  # noqa: F401
from exod.core.placement.placed import Placement, PlacementRefused, Seat  # noqa: F401
from exod.core.placement.planner import place  # noqa: F401
