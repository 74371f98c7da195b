"""Runner log lines go to stderr with an sd-daemon priority prefix (`<3>` error … `<7>` debug).

The daemon reads the prefix to pick the log level (as journald does with SyslogLevelPrefix=),
so a runner started directly by systemd logs correctly too.
"""

from __future__ import annotations

import sys

ERR, WARNING, NOTICE, INFO, DEBUG = 3, 4, 5, 6, 7


def log(msg: str, level: int = INFO) -> None:
    """Never raises: stderr is a pipe to the daemon, and when the daemon is gone (SIGKILL, the
    OOM killer) a line has nowhere to go, while the runner must still stop cleanly."""
    try:
        for line in msg.splitlines() or [""]:
            sys.stderr.write(f"<{level}>{line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # EPIPE; ValueError: stderr already closed
        pass
