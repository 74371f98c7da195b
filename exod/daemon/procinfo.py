"""Per-process facts for status: resident memory. Linux reads /proc; elsewhere asks ps(1)."""

from __future__ import annotations

import os
import subprocess

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None  # Linux, and the process is gone
    except (OSError, ValueError, IndexError):
        return None
    try:  # macOS
        # ps exits 1 with no output once the pid is gone: that is the None below, not an error.
        out = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True,
                             text=True, timeout=2, check=False).stdout.strip()
        return int(out) * 1024 if out else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
