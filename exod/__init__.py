"""exod: local mlx-lm inference as a supervised operating-system service."""

import glob
import os
import sys


def _version() -> str:
    """The installed distribution's version, read from its metadata (METADATA of the
    dist-info on sys.path, as importlib.metadata would find it), so that `exod --version`, the
    startup line and the stamp in installed service files agree with pyproject. Read directly:
    importing importlib.metadata costs the daemon a quarter of a second on a loaded machine,
    before its first word to the service manager."""
    for entry in sys.path:
        for meta in sorted(glob.glob(os.path.join(entry or ".", "exod-*.dist-info", "METADATA"))):
            with open(meta, encoding="utf-8") as f:
                for line in f:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():
                        break
    return "0+unknown"  # imported from a source tree that was never installed


__version__ = _version()
