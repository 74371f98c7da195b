"""Runner log lines go to stderr with an sd-daemon priority prefix (`<3>` error … `<7>` debug).

The daemon reads the prefix to pick the log level (as journald does with SyslogLevelPrefix=),
so a runner started directly by systemd logs correctly too.
"""

from __future__ import annotations

import sys

ERR, WARNING, NOTICE, INFO, DEBUG = 3, 4, 5, 6, 7


def log(msg: str, level: int = INFO) -> None:
    for line in msg.splitlines() or [""]:
        sys.stderr.write(f"<{level}>{line}\n")
    sys.stderr.flush()
