"""Per-process facts for status: resident memory.

Read on the event loop for every status, so it must never block: Linux reads /proc; macOS asks
the kernel through libproc's proc_pidinfo (no subprocess). Anything else reports None.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

PROC_PIDTASKINFO = 4  # <sys/proc_info.h>


class _TaskInfo(ctypes.Structure):
    """struct proc_taskinfo: only the leading fields are read, but the size must match."""

    _fields_ = [("virtual_size", ctypes.c_uint64), ("resident_size", ctypes.c_uint64),
                ("total_user", ctypes.c_uint64), ("total_system", ctypes.c_uint64),
                ("threads_user", ctypes.c_uint64), ("threads_system", ctypes.c_uint64),
                ("counters", ctypes.c_int32 * 12)]


_libproc: ctypes.CDLL | None = None


def rss_bytes(pid: int) -> int | None:
    if sys.platform == "darwin":
        return _darwin_rss(pid)
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None  # gone, or no /proc


def _darwin_rss(pid: int) -> int | None:
    global _libproc
    try:
        if _libproc is None:
            _libproc = ctypes.CDLL(ctypes.util.find_library("proc") or "/usr/lib/libproc.dylib")
        info = _TaskInfo()
        n = _libproc.proc_pidinfo(pid, PROC_PIDTASKINFO, ctypes.c_uint64(0),
                                  ctypes.byref(info), ctypes.sizeof(info))
    except (OSError, AttributeError):
        return None
    return int(info.resident_size) if n == ctypes.sizeof(info) else None


# What a new runner may use. macOS: Metal's recommended working set is not readable without
# Metal (the daemon never loads mlx); on Apple silicon it is about three quarters of the RAM,
# which is the figure used here, less the resident memory of exod's own runners.
MACOS_WORKING_SET = 0.75


def available_bytes(used_by_runners: int = 0) -> int | None:
    """Memory a new rank can take: MemAvailable on Linux; on macOS an approximation of the
    GPU's recommended working set (see MACOS_WORKING_SET). None when it cannot be told.

    EXOD_MEMORY_AVAILABLE (a size, e.g. 24GiB) replaces what the kernel says with a budget for
    exod's runners, for hosts whose limit the kernel's figure does not show (a container's
    cgroup), or to keep memory for other services."""
    budget = os.environ.get("EXOD_MEMORY_AVAILABLE")
    if budget:
        from exod.core.sizes import parse_size

        return max(0, parse_size(budget) - used_by_runners)
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/meminfo", "rb") as f:
                for line in f:
                    if line.startswith(b"MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            return None
        return None
    if sys.platform == "darwin":
        total = _sysctl_u64(b"hw.memsize")
        if total is None:
            return None
        return max(0, int(total * MACOS_WORKING_SET) - used_by_runners)
    return None


def total_bytes() -> int | None:
    """The host's memory: MemTotal on Linux, hw.memsize on macOS; None when it cannot be told."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/meminfo", "rb") as f:
                for line in f:
                    if line.startswith(b"MemTotal:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            return None
        return None
    if sys.platform == "darwin":
        return _sysctl_u64(b"hw.memsize")
    return None


def _sysctl_u64(name: bytes) -> int | None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    value = ctypes.c_uint64(0)
    size = ctypes.c_size_t(ctypes.sizeof(value))
    if libc.sysctlbyname(name, ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
        return None
    return int(value.value)
