"""The usage and audit logs on disk: JSON lines fsynced one by one, rotated by size with the
oldest removed past `keep_files`, private whatever the umask; the quotas rebuilt from them at
start, what rotation removed kept in the checkpoint once; and the sums `exoctl usage` prints."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pytest

from exod.config.schema import UsageLog
from exod.core.usage.record import UsageRecord, parse_line
from exod.core.usage.summary import summarise
from exod.daemon.usage import journal as journal_mod
from exod.daemon.usage.journal import Journal, numbered
from exod.daemon.usage.keeper import UsageKeeper
from exod.daemon.usage.ledger import CHECKPOINT, Ledger

NOON = 1751284800.0  # 2025-06-30T12:00:00Z


def rec(key: str = "alice", instance: str = "tiny", prompt: int = 10, completion: int = 5,
        time: float = NOON, status: int = 200) -> UsageRecord:
    return UsageRecord(time, key, instance, instance, "chat", status, prompt, 2, completion,
                       0.5, 0.75)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_line_is_on_disk_fsynced_when_append_returns(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(journal_mod.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    j = Journal(tmp_path / "log", "usage", 1 << 20, 3)
    j.open()
    synced.clear()
    j.append(rec().to_json())
    assert synced, "the line was not fsynced"
    (path,) = [p for _, p in numbered(tmp_path / "log", "usage")]
    assert parse_line(path.read_bytes()) == rec()


def test_folder_and_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o000)
    try:
        j = Journal(tmp_path / "a" / "log", "usage", 1 << 20, 3)
        j.open()
        j.append({"x": 1})
    finally:
        os.umask(old)
    assert mode(tmp_path / "a" / "log") == 0o700 and mode(tmp_path / "a") == 0o700
    assert [mode(p) for _, p in numbered(tmp_path / "a" / "log", "usage")] == [0o600]


def test_rotation_keeps_the_newest_files(tmp_path: Path) -> None:
    dropped: list[int] = []
    j = Journal(tmp_path, "usage", 100, 3, lambda path, seq: dropped.append(seq))
    j.open()
    for i in range(20):
        j.append({"i": i, "pad": "x" * 40})  # two lines fill a file
    files = numbered(tmp_path, "usage")
    assert [seq for seq, _ in files] == [9, 10, 11] and dropped == list(range(1, 9))
    lines = [json.loads(x)["i"] for _, p in files for x in p.read_bytes().splitlines()]
    assert lines == list(range(16, 20))  # the newest file is empty, just begun


def test_a_line_torn_by_a_crash_stays_alone(tmp_path: Path) -> None:
    (tmp_path / "usage-00000001.jsonl").write_bytes(b'{"a": 1}\n{"tor')
    j = Journal(tmp_path, "usage", 1 << 20, 3)
    j.open()
    j.append({"b": 2})
    assert (tmp_path / "usage-00000001.jsonl").read_bytes() == b'{"a": 1}\n{"tor\n{"b":2}\n'


def test_quotas_are_rebuilt_from_the_log_and_the_checkpoint_counts_nothing_twice(
        tmp_path: Path) -> None:
    ledger = Ledger(tmp_path, "usage")
    j = Journal(tmp_path, "usage", 300, 2, ledger.dropping)
    j.open()
    for _ in range(12):
        j.append(rec(prompt=10, completion=5).to_json())
    j.append(rec(key="bob", prompt=1, completion=1, time=NOON - 86400).to_json())
    assert (tmp_path / CHECKPOINT).exists() and mode(tmp_path / CHECKPOINT) == 0o600
    quotas = Ledger(tmp_path, "usage").rebuild()
    assert quotas.used("alice", "day", NOON) == 180 and quotas.used("alice", "month", NOON) == 180
    assert quotas.used("bob", "day", NOON) == 0 and quotas.used("bob", "month", NOON) == 2
    # A crash between the checkpoint's write and the file's removal: the file is still there.
    through = json.loads((tmp_path / CHECKPOINT).read_bytes())["through"]
    (tmp_path / f"usage-{through:08d}.jsonl").write_bytes(
        json.dumps(rec(prompt=1000).to_json()).encode() + b"\n")
    assert Ledger(tmp_path, "usage").rebuild().used("alice", "day", NOON) == 180


def test_a_checkpoint_exod_did_not_write_is_refused_with_what_to_do(tmp_path: Path) -> None:
    (tmp_path / CHECKPOINT).write_text("[1, 2]")
    with pytest.raises(OSError, match="move it away"):
        Ledger(tmp_path, "usage").rebuild()


def test_summary_sums_per_key_and_instance_since_a_moment() -> None:
    records = [rec(), rec(prompt=1, completion=1, status=499), rec(instance="big"),
               rec(key="bob"), rec(time=NOON - 10 * 86400)]
    sums = summarise(records, since=NOON - 86400)
    assert [(s.key, s.instance, s.requests, s.failed, s.prompt_tokens, s.completion_tokens)
            for s in sums] == [("alice", "big", 1, 0, 10, 5), ("alice", "tiny", 2, 1, 11, 6),
                               ("bob", "tiny", 1, 0, 10, 5)]
    assert sums[1].cached_tokens == 4 and sums[1].batch_seconds == 1.0
    assert [s.key for s in summarise(records, key="bob")] == ["bob"]
    assert summarise(records)[1].requests == 3


def test_the_keeper_records_counts_audits_and_sums(tmp_path: Path) -> None:
    async def run() -> None:
        keeper = UsageKeeper(UsageLog(folder=tmp_path / "usage"))
        await keeper.start()
        await keeper.record(rec())
        await keeper.record(rec(key="bob", prompt=3))
        await keeper.audit("carol", "POST /api/pull", 403, model="hf:x/y")
        assert keeper.totals["alice", "tiny"].prompt_tokens == 10
        sums = await keeper.summary("bob", None)
        assert [(s.key, s.prompt_tokens) for s in sums] == [("bob", 3)]
        keeper.close()
        again = UsageKeeper(UsageLog(folder=tmp_path / "usage"))
        await again.start()  # a restart: the quotas are what the log says
        assert again.gate.quotas.used("alice", "day", NOON) == 15
        again.close()
    asyncio.run(run())
    (audit,) = [p for _, p in numbered(tmp_path / "usage", "audit")]
    line = json.loads(audit.read_bytes())
    assert (line["key"], line["action"], line["status"], line["model"]) == (
        "carol", "POST /api/pull", 403, "hf:x/y")
    assert line["time"].endswith("Z")


def test_a_log_that_cannot_be_opened_stops_the_start_saying_where(tmp_path: Path) -> None:
    (tmp_path / "usage").write_text("a file where the folder goes")
    keeper = UsageKeeper(UsageLog(folder=tmp_path / "usage"))
    with pytest.raises(OSError, match="usage log in"):
        asyncio.run(keeper.start())


def test_a_line_of_another_kind_is_no_record() -> None:
    assert parse_line(b'{"time": "2025-06-30T12:00:00Z"}') is None
    assert parse_line(b"{not json") is None
    assert parse_line(json.dumps(rec().to_json())) == rec()
