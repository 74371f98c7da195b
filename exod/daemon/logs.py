"""Log output that fits where the daemon runs.

Under systemd (stderr is the journal stream named by JOURNAL_STREAM) every line starts with an
sd-daemon priority prefix such as `<4>` so `journalctl -p warning` filters correctly, and carries
no timestamp (the journal has its own). Elsewhere: a human format with time, and colour on a TTY.
Each line names its instance, rank and pid when the event has them.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from loguru import logger

PRIORITY = {"TRACE": 7, "DEBUG": 7, "INFO": 6, "SUCCESS": 5, "WARNING": 4, "ERROR": 3,
            "CRITICAL": 2}
LEVEL_BY_PRIORITY = {0: "CRITICAL", 1: "CRITICAL", 2: "CRITICAL", 3: "ERROR", 4: "WARNING",
                     5: "SUCCESS", 6: "INFO", 7: "DEBUG"}


def stderr_is_journal() -> bool:
    """True when stderr is the very stream systemd connected to journald (sd_journal_stream_fd)."""
    value = os.environ.get("JOURNAL_STREAM", "")
    dev, _, ino = value.partition(":")
    if not dev or not ino:
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return f"{st.st_dev}:{st.st_ino}" == value


def _context(record: Any) -> None:
    extra = record["extra"]
    parts = []
    if "instance" in extra:
        parts.append(str(extra["instance"]))
        if "rank" in extra:
            parts[-1] += f"/{extra['rank']}"
    if extra.get("pid"):
        parts.append(f"pid {extra['pid']}")
    extra["ctx"] = f"[{' '.join(parts)}] " if parts else ""
    extra["prio"] = PRIORITY.get(record["level"].name, 6)



def configure(level: str = "INFO", fmt: str = "auto") -> None:
    """`auto` picks `journal` under systemd and `human` elsewhere; `json` writes one JSON object
    per line (loguru's serialized record, with instance/rank/pid in record.extra)."""
    if fmt == "auto":
        fmt = "journal" if stderr_is_journal() else "human"
    logger.remove()
    logger.configure(patcher=_context)
    common: dict[str, Any] = {"level": level, "backtrace": False, "diagnose": False}
    if fmt == "journal":
        logger.add(sys.stderr, format="<{extra[prio]}>{extra[ctx]}{message}", colorize=False,
                   **common)
    elif fmt == "json":
        logger.add(sys.stderr, format="{message}", serialize=True, **common)
    else:
        logger.add(sys.stderr, colorize=None, **common, format=(
            "<green>{time:YYYY-MM-DD HH:mm:ss.SSS}</green> <level>{level: <7}</level> "
            "<cyan>{extra[ctx]}</cyan>{message}"))


def split_priority(line: str) -> tuple[str, str]:
    """A runner's `<N>text` line → (loguru level, text); no prefix → INFO."""
    if len(line) >= 3 and line[0] == "<" and line[2] == ">" and line[1] in "01234567":
        return LEVEL_BY_PRIORITY[int(line[1])], line[3:]
    return "INFO", line  # anything else (`<9>`, `<x>`) is text: parsing a line never fails
