"""`exoctl wait`'s progress bar: layers loaded across the instance's ranks, on a TTY only."""

from __future__ import annotations

import shutil
import sys
from exod.wire.control_status import InstanceStatus


class ProgressBar:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._drawn = False

    def update(self, inst: InstanceStatus) -> None:
        if not self.enabled:
            return
        done = sum(r.layers_loaded for r in inst.ranks)
        total = sum(r.layers_total for r in inst.ranks)
        label = f"{inst.name}: {inst.detail}"
        width = max(10, min(40, shutil.get_terminal_size().columns - len(label) - 4))
        filled = int(width * done / total) if total else 0
        sys.stdout.write(f"\r\x1b[K[{'#' * filled}{'.' * (width - filled)}] {label}")
        sys.stdout.flush()
        self._drawn = True

    def finish(self) -> None:
        if self._drawn:
            sys.stdout.write("\r\x1b[K")
            sys.stdout.flush()
            self._drawn = False
