"""exod: local mlx-lm inference as a supervised operating-system service."""

from importlib.metadata import PackageNotFoundError, version


def _version() -> str:
    """The installed distribution's version (pyproject's, through the package metadata), so that
    `exod --version`, the startup line and the stamp in installed service files agree."""
    try:
        return version("exod")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "0+unknown"


__version__ = _version()
