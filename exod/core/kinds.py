"""What the config schema declares of a field beyond its Python type: the value kinds that need
more to validate (see `exod.config.validate`), and the operator-facing documentation (`doc`)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated


class Kind(enum.Enum):
    DURATION = "duration"  # '500ms', '10s', '2m', '1h' or a number of seconds -> float seconds
    MODEL_DIR = "model_dir"  # directory that exists and holds config.json; relative to its file
    PATH = "path"  # any path; relative to the folder of the file that holds it
    INSTANCE_NAME = "instance_name"  # safe charset: ends up in file names and status lines
    OCTAL = "octal"  # file mode: 0660 / '0660' / 432
    SIZE = "size"  # '512MiB', '2GiB', '800MB' or a number of bytes -> int bytes
    DURATION_OR_NEVER = "duration_or_never"  # a duration, or `never` -> math.inf
    JSON = "json"  # plain data as JSON has it: null, true, numbers, strings, lists, mappings
    NETWORK = "network"  # an IP network (10.0.0.0/8, fd00::/8) or one address
    COUNT_OR_AUTO = "count_or_auto"  # a whole number, or `auto` -> AUTO


Duration = Annotated[float, Kind.DURATION]
ModelDir = Annotated[Path, Kind.MODEL_DIR]
InstanceName = Annotated[str, Kind.INSTANCE_NAME]
Octal = Annotated[int, Kind.OCTAL]
Size = Annotated[int, Kind.SIZE]
DurationOrNever = Annotated[float, Kind.DURATION_OR_NEVER]
JsonValue = Annotated[object, Kind.JSON]
Network = Annotated[str, Kind.NETWORK]
CountOrAuto = Annotated[int, Kind.COUNT_OR_AUTO]

AUTO = 0  # a CountOrAuto written `auto`: no count is 0, so it cannot be mistaken for one

INSTANCE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"


def doc(text: str, **extra: object) -> dict[str, object]:
    """Field metadata: operator-facing documentation (plus validator hints)."""
    return {"doc": text, **extra}
