"""`exoctl pull`'s progress, drawn as `ollama pull` draws it: a line per step (`pulling
manifest`, `pulling ORG/NAME: 27% ▕███      ▏ 1.1GiB/4.2GiB 36.2MiB/s 1m32s`, `verifying
sha256 digest`, `success`), the current one redrawn in place on a terminal. Pure: events in,
text out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exod.wire import control as cm
from exod.core.durations import format_duration
from exod.core.sizes import format_size

BAR = 16  # cells of the bar


def bar(done: int, total: int) -> str:
    filled = BAR * done // total if total else BAR
    return "▕" + "█" * filled + " " * (BAR - filled) + "▏"


def step_line(repo: str, ev: cm.DownloadEvent) -> tuple[str, str]:
    """(the step, its line): a new step starts a new line, the same step redraws it."""
    if ev.phase == "starting":
        return "manifest", "pulling manifest"
    if ev.phase == "waiting":
        return "waiting", ev.detail
    total = max(ev.total_bytes, 1)
    pct = 100 * min(ev.done_bytes, total) // total
    if ev.phase == "verifying":
        return "verify", f"verifying sha256 digest {pct:3d}% {bar(ev.done_bytes, total)}"
    tail = ""
    if ev.bytes_per_s:
        left = (total - ev.done_bytes) / ev.bytes_per_s
        tail = f" {format_size(ev.bytes_per_s)}/s {format_duration(left)}"
    return "pull", (f"pulling {repo}: {pct:3d}% {bar(ev.done_bytes, total)} "
                    f"{format_size(ev.done_bytes)}/{format_size(total)}{tail}")


@dataclass
class PullView:
    """What a terminal shows: finished steps stay, the current one is redrawn."""

    repo: str
    tty: bool
    step: str = ""
    line: str = ""
    out: list[str] = field(default_factory=list)  # text to write, in order

    def event(self, ev: cm.DownloadEvent) -> None:
        step, line = step_line(self.repo, ev)
        if step != self.step and self.step:
            self._end_line()
        self.step, self.line = step, line
        if self.tty:
            self.out.append(f"\r\033[K{line}")

    def _end_line(self) -> None:
        self.out.append("\n" if self.tty else self.line + "\n")

    def finish(self, ok: bool) -> None:
        if self.step:
            self._end_line()
        self.step = ""
        if ok:
            self.out.append("success\n")

    def take(self) -> str:
        text, self.out = "".join(self.out), []
        return text
