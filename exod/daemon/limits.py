"""Process limits the daemon sets for itself at start."""

from __future__ import annotations

import resource

# macOS refuses a soft limit above OPEN_MAX (10240) even when the hard limit is "unlimited".
CEILING = 1 << 20


def raise_nofile() -> tuple[int, int]:
    """Raise the soft limit on open files to the hard limit: every connection, pipe and
    runner channel takes a descriptor, and the usual soft default (1024) is easily used up by
    a flood of idle connections. Returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = CEILING if hard == resource.RLIM_INFINITY else min(hard, CEILING)
    if soft != resource.RLIM_INFINITY and soft < target:
        for want in (target, 10240):
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
                return soft, want
            except (ValueError, OSError):
                continue
    return soft, soft
