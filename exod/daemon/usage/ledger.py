"""The quotas' totals across restarts, rebuilt from the usage log when the daemon starts. The
log's files are read whole; what rotation removes is first folded into a checkpoint,
`quota.json` (written atomically, mode 0600), which names the last file it holds, so a crash
between the fold and the removal counts nothing twice."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from exod.core.usage.calendar import PERIODS
from exod.core.usage.quota import Quotas
from exod.core.usage.record import parse_line
from exod.daemon.usage.journal import FILE_MODE, sync_folder, lines

CHECKPOINT = "quota.json"


class Ledger:
    def __init__(self, folder: Path, stem: str) -> None:
        self.folder, self.stem = folder, stem
        self.path = folder / CHECKPOINT
        self.through = 0  # the last file the checkpoint holds
        self.folded = Quotas()  # what it holds

    def rebuild(self) -> Quotas:
        """The totals of the checkpoint and of every file after it."""
        self._read()
        quotas = Quotas()
        quotas.merge(self.folded)
        for _, line in lines(self.folder, self.stem, after=self.through):
            record = parse_line(line)
            if record is not None:
                quotas.add(record.key, record.tokens, record.time)
        return quotas

    def _read(self) -> None:
        try:
            obj: Any = json.loads(self.path.read_bytes())
            through = int(obj["through"])
            folded = Quotas()
            for key, period, win, tokens in obj["used"]:
                if period in PERIODS:
                    folded.add_to(str(key), period, str(win), int(tokens))
        except FileNotFoundError:
            return
        except (ValueError, KeyError, TypeError) as e:
            raise OSError(f"{self.path} is not a quota checkpoint exod wrote ({e}): move it "
                          "away to count the quotas from the usage log alone") from None
        self.through, self.folded = through, folded

    def dropping(self, path: Path, seq: int) -> None:
        """Rotation removes file `seq`: fold its records into the checkpoint first."""
        if seq <= self.through:
            return
        with open(path, "rb") as f:
            for line in f:
                record = parse_line(line)
                if record is not None:
                    self.folded.add(record.key, record.tokens, record.time)
        self.through = seq
        self._write()

    def _write(self) -> None:
        body = {"through": self.through, "used": [list(e) for e in self.folded.entries()]}
        tmp = self.path.with_name(f".{CHECKPOINT}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW,
                     FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)
            os.write(fd, json.dumps(body).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        sync_folder(self.folder)
