"""The one owner of what the daemon keeps of its keys' use: the gate every request passes
(exod.core.usage.gate: in flight, tokens per minute, quotas), the totals per key and instance
since the start (for /metrics), the usage log and the audit log (exod.daemon.usage.journal,
in `usage.folder`), and the quotas rebuilt from the log at start (exod.daemon.usage.ledger).
Writes run in a thread, each awaited until its line is on disk."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from exod.config.schema import UsageLog
from exod.core.usage.calendar import iso
from exod.core.usage.gate import KeyGate
from exod.core.usage.record import UsageRecord, parse_line
from exod.core.usage.summary import Sums, summarise
from exod.daemon.ratelog import RateLimitedLog
from exod.daemon.usage.journal import Journal, lines
from exod.daemon.usage.ledger import Ledger
from exod.paths import state_dir

USAGE, AUDIT = "usage", "audit"


def usage_folder(cfg: UsageLog) -> Path:
    """`usage.folder`, else `usage` in the daemon's state folder."""
    return cfg.folder if cfg.folder is not None else state_dir() / "usage"


class UsageKeeper:
    def __init__(self, cfg: UsageLog) -> None:
        self.folder = usage_folder(cfg)
        max_bytes = cfg.max_file_mib * 1024 * 1024
        self.ledger = Ledger(self.folder, USAGE)
        self.usage_log = Journal(self.folder, USAGE, max_bytes, cfg.keep_files,
                                 self.ledger.dropping)
        self.audit_log = Journal(self.folder, AUDIT, max_bytes, cfg.keep_files)
        self.gate = KeyGate()
        self.totals: dict[tuple[str, str], Sums] = {}  # since the start, by (key, instance)
        self.ratelog = RateLimitedLog()

    async def start(self) -> None:
        """Rebuild the quotas from the log and open both logs; raises OSError."""
        await asyncio.to_thread(self._open)

    def _open(self) -> None:
        try:
            self.gate.quotas = self.ledger.rebuild()
            self.usage_log.open()
            self.audit_log.open()
        except OSError as e:
            raise OSError(e.errno, f"usage log in {self.folder}: {e.strerror or e}") from None

    def close(self) -> None:
        self.usage_log.close()
        self.audit_log.close()

    async def record(self, rec: UsageRecord) -> None:
        """Count a finished request and write its line (on disk when this returns)."""
        self.totals.setdefault((rec.key, rec.instance), Sums(rec.key, rec.instance)).add(rec)
        await self._append(self.usage_log, rec.to_json())

    async def audit(self, who: str, action: str, result: int, **detail: Any) -> None:
        """A `manage` or `admin` action: who (a key's name), what, its result (an HTTP
        status), and when."""
        line = {"time": iso(time.time()), "key": who, "action": action, "status": result,
                **detail}
        await self._append(self.audit_log, line)

    async def _append(self, journal: Journal, obj: dict[str, Any]) -> None:
        try:
            await asyncio.to_thread(journal.append, obj)
        except OSError as e:  # a full disk must not fail the answer: said, and counted
            self.ratelog.error(f"journal-{journal.stem}", "cannot write the {} log in {}: {}",
                               journal.stem, self.folder, e)

    async def summary(self, key: str | None, since: float | None) -> list[Sums]:
        """The usage log's sums (exod.core.usage.summary), read off the loop."""
        def read() -> list[Sums]:
            records = (parse_line(line) for _, line in lines(self.folder, USAGE))
            return summarise((r for r in records if r is not None), since, key)
        return await asyncio.to_thread(read)

