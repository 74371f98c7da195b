"""The prompt cache's pure parts (exod.runner.prompt_cache, no mlx): matching entries by their
tokens, least recently used out by bytes, the entry file (atomic, 0600, checked on read), the
fingerprint of the weights by content, the I/O worker, and the disk tier over real files; and
around it: warm prompt files, the default folder, `exoctl cache clear` of a stopped instance."""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from pathlib import Path

import pytest

from exod.runner.prompt_cache import entry_file, fingerprint as fp
from exod.runner.prompt_cache.disk import DiskTier
from exod.runner.prompt_cache.entry_file import EntryError, Tensor
from exod.runner.prompt_cache.index import Entry, Index, common_prefix, pack, unpack, usable
from exod.runner.prompt_cache.worker import Worker


def entry(tokens: list[int], nbytes: int = 10, trimmable: bool = True) -> Entry:
    return Entry(pack(tokens), nbytes, trimmable)


# ---- matching -----------------------------------------------------------------------------------
def test_common_prefix_counts_whole_tokens() -> None:
    assert common_prefix(pack([1, 2, 3]), pack([1, 2, 4])) == 2
    assert common_prefix(pack([1, 2, 3]), pack([1, 2, 3, 4])) == 3
    assert common_prefix(pack([7]), pack([8])) == 0
    assert common_prefix(pack([]), pack([1])) == 0
    # The same low byte, another high byte: a token differs even where its first bytes agree.
    assert common_prefix(pack([1, 0x0100]), pack([1, 0x0200])) == 1
    long = list(range(30_000))
    assert common_prefix(pack(long), pack(long[:29_999] + [0])) == 29_999
    assert unpack(pack(long)) == long


def test_an_entry_covers_a_prompt_it_is_a_prefix_of_without_trimming() -> None:
    m = usable(entry([1, 2, 3], trimmable=False), pack([1, 2, 3, 4, 5]))
    assert m is not None and (m.usable, m.trim) == (3, 0)


def test_the_same_prompt_again_keeps_its_last_token_to_run() -> None:
    m = usable(entry([1, 2, 3]), pack([1, 2, 3]))
    assert m is not None and (m.usable, m.trim) == (2, 1)
    # A cache that cannot be rewound (a hybrid model's) cannot give back the last token.
    assert usable(entry([1, 2, 3], trimmable=False), pack([1, 2, 3])) is None


def test_an_entry_past_the_prompt_is_trimmed_only_when_it_can_be() -> None:
    m = usable(entry([1, 2, 3, 9, 9]), pack([1, 2, 3, 4]))
    assert m is not None and (m.usable, m.trim) == (3, 2)
    assert usable(entry([1, 2, 3, 9, 9], trimmable=False), pack([1, 2, 3, 4])) is None
    assert usable(entry([5, 6]), pack([1, 2])) is None


def test_the_best_match_covers_most_then_trims_least_then_is_most_recent() -> None:
    idx = Index(1000)
    short, long = entry([1, 2], trimmable=False), entry([1, 2, 3, 4], trimmable=False)
    idx.add(short)
    idx.add(long)
    best = idx.best(pack([1, 2, 3, 4, 5]))
    assert best is not None and best.entry is long
    a, b = entry([1, 2, 3, 7]), entry([1, 2, 3, 8])
    idx.add(a)
    idx.add(b)
    best = idx.best(pack([1, 2, 3, 5, 6, 7]))
    assert best is not None and best.entry is b and (best.usable, best.trim) == (3, 1)
    idx.touch(a)
    best = idx.best(pack([1, 2, 3, 5, 6, 7]))
    assert best is not None and best.entry is a


def test_least_recently_used_entries_leave_first_by_bytes_and_pinned_ones_stay() -> None:
    idx = Index(30)
    a, b, c = entry([1], 10), entry([2], 10), entry([3], 10)
    for e in (a, b, c):
        assert idx.add(e).evicted == []
    idx.touch(a)  # b is now the oldest
    b.pins = 1
    d = entry([4], 15)
    out = idx.add(d)
    assert out.evicted == [c, a]  # b is pinned: then the oldest, until 25 bytes are held
    assert idx.nbytes == 25 and list(idx) == [b, d]
    assert idx.fit(1000, count=1) == [d] and list(idx) == [b]  # b pinned: still in


def test_an_entry_alone_past_the_budget_evicts_nothing() -> None:
    idx = Index(30)
    small = entry([1])
    idx.add(small)
    out = idx.add(entry([2], 31))
    assert len(out.evicted) == 1 and out.evicted[0].length == 1 and idx.get(small.key)


def test_a_trimmable_entry_makes_its_prefixes_redundant_and_is_not_added_under_one() -> None:
    idx = Index(1000)
    short = entry([1, 2])
    idx.add(short)
    out = idx.add(entry([1, 2, 3]))
    assert out.redundant == [short] and len(idx) == 1
    again = entry([1, 2])
    assert idx.add(again).redundant == [again] and len(idx) == 1
    assert idx.covered(pack([1, 2])) and idx.covered(pack([1, 2, 3]))
    assert not idx.covered(pack([1, 2, 3, 4]))
    hybrid = Index(1000)
    hybrid.add(entry([1, 2], trimmable=False))
    hybrid.add(entry([1, 2, 3], trimmable=False))  # cannot serve [1, 2]: both stay
    assert len(hybrid) == 2 and not hybrid.covered(pack([1]))


# ---- the entry file ----------------------------------------------------------------------------
def tensors(fill: int = 1) -> list[Tensor]:
    return [Tensor("0.0", "F32", (1, 2), memoryview(bytes([fill]) * 8)),
            Tensor("0.1", "I32", (3,), memoryview(bytes(12)))]


def meta(tokens: list[int]) -> dict[str, str]:
    return entry_file.exod_metadata(pack(tokens), True, "f" * 32, fp.FORMAT_VERSION)


def write(folder: Path, name: str, ts: list[Tensor], metadata: dict[str, str]) -> int:
    return entry_file.write(folder, name, entry_file.header(ts, metadata), ts)


def test_an_entry_file_is_written_whole_with_mode_0600_and_reads_back(tmp_path: Path) -> None:
    os.umask(0o022)
    size = write(tmp_path, "e.safetensors", tensors(), meta([5, 6, 7]))
    path = tmp_path / "e.safetensors"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_size == size
    assert [p.name for p in tmp_path.iterdir()] == ["e.safetensors"]  # no temporary file left
    h = entry_file.read_header(path)
    assert unpack(h.tokens) == [5, 6, 7] and h.trimmable and h.size == size
    assert h.tensors["0.1"] == {"dtype": "I32", "shape": [3], "data_offsets": [8, 20]}
    entry_file.verify(path, h)


def test_a_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(OSError):
        write(tmp_path / "gone", "e.safetensors", tensors(), meta([1]))

    def full(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError):
        write(tmp_path, "e.safetensors", tensors(), meta([1]))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage", ["truncated", "corrupt data", "corrupt header", "empty",
                                    "not ours"])
def test_a_damaged_file_is_an_entry_error(tmp_path: Path, damage: str) -> None:
    write(tmp_path, "e.safetensors", tensors(), meta([5, 6, 7]))
    path = tmp_path / "e.safetensors"
    raw = bytearray(path.read_bytes())
    if damage == "truncated":
        raw = raw[:-5]
    elif damage == "corrupt data":
        raw[-3] ^= 0xFF
    elif damage == "corrupt header":
        raw[9] = ord("}")
    elif damage == "empty":
        raw = bytearray()
    else:
        raw = raw.replace(b"exod_crc", b"exod_xyz")
    path.write_bytes(bytes(raw))
    with pytest.raises(EntryError):
        entry_file.verify(path, entry_file.read_header(path))


# ---- the weights' fingerprint ------------------------------------------------------------------
def model_dir(root: Path, content: bytes = b"weights") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text('{"model_type": "llama"}')
    (root / "model.safetensors").write_bytes(content)
    return root


def test_new_weights_at_the_same_path_are_a_new_digest_even_with_size_and_mtime_kept(
        tmp_path: Path) -> None:
    d = model_dir(tmp_path / "m", b"AAAAAAAA")
    files = fp.weight_files(d, None)
    assert sorted(files) == ["model/config.json", "model/model.safetensors"]
    before, read = fp.digest(files, fp.Records(tmp_path / "weights.json"))
    assert read > 0
    st = (d / "model.safetensors").stat()
    (d / "model.safetensors").write_bytes(b"AAAABAAA")  # same size
    os.utime(d / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime
    after, _ = fp.digest(files, fp.Records(tmp_path / "weights.json"))
    assert after != before


@pytest.fixture
def no_racy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trust a hash taken right after a write: a test cannot age a file's ctime."""
    monkeypatch.setattr(fp, "RACY", -1.0)


def test_a_recorded_hash_is_reused_beside_the_files_until_they_change(
        tmp_path: Path, no_racy: None) -> None:
    d = model_dir(tmp_path / "m")
    files = fp.weight_files(d, None)
    first, read = fp.digest(files, fp.Records(tmp_path / "cache" / "weights.json"))
    assert read > 0 and (d / fp.RECORD).exists()
    again, read = fp.digest(files, fp.Records(tmp_path / "cache" / "weights.json"))
    assert (again, read) == (first, 0)
    assert fp.to_hash(files, fp.Records(tmp_path / "x.json")) == 0
    (d / "model.safetensors").write_bytes(b"weightz")
    changed, read = fp.digest(files, fp.Records(tmp_path / "cache" / "weights.json"))
    assert changed != first and read == len(b"weightz")


def test_a_hash_taken_right_after_a_change_is_taken_again(tmp_path: Path) -> None:
    d = model_dir(tmp_path / "m")  # just written: within the racy window
    files = fp.weight_files(d, None)
    fp.digest(files, fp.Records(tmp_path / "w.json"))
    _, read = fp.digest(files, fp.Records(tmp_path / "w.json"))
    assert read > 0


def test_linked_files_keep_their_record_in_the_cache_folder(tmp_path: Path,
                                                             no_racy: None) -> None:
    blobs = model_dir(tmp_path / "blobs")
    snap = tmp_path / "snapshot"
    snap.mkdir()
    for name in ("config.json", "model.safetensors"):
        (snap / name).symlink_to(blobs / name)
    record = tmp_path / "cache" / "weights.json"
    fp.digest(fp.weight_files(snap, None), fp.Records(record))
    assert record.exists() and not (blobs / fp.RECORD).exists()
    assert not (snap / fp.RECORD).exists()
    _, read = fp.digest(fp.weight_files(snap, None), fp.Records(record))
    assert read == 0


def test_an_adapter_is_part_of_the_digest(tmp_path: Path) -> None:
    d = model_dir(tmp_path / "m")
    a = tmp_path / "adapter"
    a.mkdir()
    (a / "adapter_config.json").write_text("{}")
    (a / "adapters.safetensors").write_bytes(b"lora-1")
    records = fp.Records(tmp_path / "w.json")
    plain, _ = fp.digest(fp.weight_files(d, None), records)
    one, _ = fp.digest(fp.weight_files(d, a), records)
    (a / "adapters.safetensors").write_bytes(b"lora-2")
    two, _ = fp.digest(fp.weight_files(d, a), records)
    assert len({plain, one, two}) == 3
    assert fp.fingerprint({"a": 1, "b": "x"}) == fp.fingerprint({"b": "x", "a": 1})
    assert fp.fingerprint({"kv_bits": 4}) != fp.fingerprint({"kv_bits": 8})


# ---- the worker ---------------------------------------------------------------------------------
def test_the_worker_runs_jobs_in_order_past_a_failing_one_and_refuses_past_its_bytes() -> None:
    w = Worker("test", max_bytes=10)
    gate, ran = threading.Event(), []

    def boom() -> None:
        raise OSError("disk on fire")

    assert w.submit(lambda: None if gate.wait() else None)
    assert w.submit(lambda: ran.append(1), nbytes=6)
    assert not w.submit(lambda: ran.append(2), nbytes=6)  # 12 queued bytes > 10
    assert w.submit(boom) and w.submit(lambda: ran.append(3), nbytes=4)
    assert not w.drain(time.monotonic() + 0.05)  # the gate holds it
    gate.set()
    assert w.drain(time.monotonic() + 30) and ran == [1, 3] and w.idle


def test_a_job_past_the_worker_s_bytes_is_taken_alone_only() -> None:
    """An entry bigger than the bound (an agent's prompt on a real model) is written when the
    thread has nothing else: at most one is held past the bound."""
    w = Worker("test", max_bytes=10)
    gate, ran = threading.Event(), []
    assert w.submit(lambda: None if gate.wait() else None)
    assert not w.submit(lambda: ran.append(1), nbytes=50)  # the thread is busy
    gate.set()
    assert w.drain(time.monotonic() + 30)
    assert w.submit(lambda: None if gate.wait() else None, nbytes=50)  # alone: taken
    assert not w.submit(lambda: ran.append(2), nbytes=50)  # another beside it: refused
    assert w.drain(time.monotonic() + 30) and ran == [] and w.idle


def test_dropped_jobs_never_run() -> None:
    w = Worker("test")
    started, gate, ran = threading.Event(), threading.Event(), []
    def hold() -> None:
        started.set()
        gate.wait()

    w.submit(hold)
    w.submit(lambda: ran.append(1))
    assert started.wait(30)
    assert w.drop() == 1
    gate.set()
    assert w.drain(time.monotonic() + 30) and ran == []


# ---- the disk tier over real files -------------------------------------------------------------
PARTS = {"format": fp.FORMAT_VERSION, "dtype": "float32"}


def opened(root: Path, model: Path, budget: int = 1 << 20, parts: dict[str, object] = PARTS,
           rank: int = 0) -> DiskTier:
    tier = DiskTier(root, rank, budget)
    tier.open(parts, fp.weight_files(model, None))
    assert tier.writer.drain(time.monotonic() + 30), "the tier did not open"
    return tier


def put(tier: DiskTier, tokens: list[int], fill: int = 1, trimmable: bool = True) -> None:
    t = tensors(fill)
    packed = pack(tokens)
    assert tier.write(packed, trimmable, t, entry_file.exod_metadata(
        packed, trimmable, tier.fingerprint, fp.FORMAT_VERSION))
    assert tier.writer.drain(time.monotonic() + 30)


def test_entries_survive_a_new_tier_on_the_same_folder(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "m")
    tier = opened(tmp_path / "cache", model)
    assert tier.ready and tier.state == "ready"
    assert stat.S_IMODE(tier.folder.stat().st_mode) == 0o700  # type: ignore[union-attr]
    put(tier, [1, 2, 3, 4])
    put(tier, [9, 9])
    again = opened(tmp_path / "cache", model)
    m = again.match(pack([1, 2, 3, 4, 5]))
    assert m is not None and m.usable == 4 and len(again.index) == 2
    job = again.load(m.entry)
    assert job.done.wait(30) and job.error is None
    again.loaded(job, ok=True)


def test_other_weights_or_settings_are_a_miss_and_their_folder_goes(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "m")
    put(opened(tmp_path / "cache", model), [1, 2, 3])
    other = opened(tmp_path / "cache", model, parts={**PARTS, "kv_bits": 8})
    assert other.match(pack([1, 2, 3, 4])) is None
    assert [p.name for p in (tmp_path / "cache" / "rank0").iterdir()] == [other.fingerprint]
    (model / "model.safetensors").write_bytes(b"new weights")
    assert opened(tmp_path / "cache", model).match(pack([1, 2, 3, 4])) is None


def test_a_damaged_file_is_a_miss_with_one_log_line_and_goes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = model_dir(tmp_path / "m")
    tier = opened(tmp_path / "cache", model)
    put(tier, [1, 2, 3])
    put(tier, [4, 5, 6], fill=2)
    m = tier.match(pack([1, 2, 3, 7]))
    assert m is not None and tier.folder is not None
    path = tier.folder / str(m.entry.payload)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    job = tier.load(m.entry)
    assert job.done.wait(30) and job.error is not None and "corrupt" in job.error
    tier.loaded(job, ok=False)
    assert tier.writer.drain(time.monotonic() + 30)
    assert tier.match(pack([1, 2, 3, 7])) is None and not path.exists()
    # A file cut short is seen when the tier opens: a miss, removed, and one line for it.
    other = tier.folder / str(tier.match(pack([4, 5, 6, 7])).entry.payload)  # type: ignore
    other.write_bytes(other.read_bytes()[:-4])
    (tier.folder / ".x.safetensors.1234.tmp").write_bytes(b"half")  # a write cut by an exit
    again = opened(tmp_path / "cache", model)
    assert len(again.index) == 0 and list(tier.folder.iterdir()) == []
    err = capsys.readouterr().err
    assert err.count("corrupt") == 1 and err.count("bytes where its header") == 1
    assert tier.stats.errors == 1


def test_a_write_evicts_the_least_recently_used_files_for_the_budget(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "m")
    size = write(tmp_path, "probe", tensors(), meta([1, 2, 3]))
    tier = opened(tmp_path / "cache", model, budget=2 * size + 100)
    put(tier, [1, 2, 3])
    put(tier, [4, 5, 6])
    put(tier, [7, 8, 9])
    assert tier.folder is not None and len(list(tier.folder.iterdir())) == 2
    assert tier.match(pack([1, 2, 3, 0])) is None and tier.match(pack([7, 8, 9, 0]))


def test_an_unwritable_folder_or_a_full_disk_is_a_miss_and_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = model_dir(tmp_path / "m")
    (tmp_path / "file").write_text("")
    tier = opened(tmp_path / "file" / "cache", model)  # a file where a folder must be
    assert not tier.ready and tier.state.startswith("off: cannot open")
    assert tier.match(pack([1, 2])) is None
    assert not tier.write(pack([1]), True, tensors(), {})

    tier = opened(tmp_path / "cache", model)
    real = os.statvfs

    class Full:
        def __init__(self, st: os.statvfs_result) -> None:
            self.f_blocks, self.f_frsize, self.f_bavail = st.f_blocks, st.f_frsize, 0

    monkeypatch.setattr(os, "statvfs", lambda p: Full(real(p)))
    put(tier, [1, 2, 3])
    put(tier, [4, 5, 6])
    assert len(tier.index) == 0 and tier.stats.errors == 2 and tier.stats.writes == 0
    assert capsys.readouterr().err.count("nearly full") == 1


def test_clear_deletes_every_file_but_the_one_being_loaded(tmp_path: Path) -> None:
    tier = opened(tmp_path / "cache", model_dir(tmp_path / "m"))
    put(tier, [1, 2, 3])
    put(tier, [4, 5, 6])
    m = tier.match(pack([1, 2, 3, 4]))
    assert m is not None
    job = tier.load(m.entry)
    tier.clear()
    assert tier.writer.drain(time.monotonic() + 30)
    assert tier.folder is not None and len(list(tier.folder.iterdir())) == 1
    assert job.done.wait(30) and job.error is None


# ---- around it: warm prompt files, the default folder, clearing a stopped instance ----------
def test_a_warm_prompt_is_json_turns_and_tools_or_plain_text(tmp_path: Path) -> None:
    from exod.config.warm import read_warm

    text = tmp_path / "system.txt"
    text.write_text("You are an agent.\n")
    assert read_warm(text).messages == [{"role": "system", "content": "You are an agent.\n"}]
    turns = tmp_path / "agent.json"
    tools = [{"type": "function", "function": {"name": "ls"}}]
    turns.write_text('{"messages": [{"role": "system", "content": "x"}], "tools": '
                     '[{"type": "function", "function": {"name": "ls"}}]}')
    got = read_warm(turns)
    assert got.messages == [{"role": "system", "content": "x"}] and got.tools == tools
    for bad, why in [('{"messages": []}', "non-empty list"),
                     ('{"messages": [{"role": 1, "content": "x"}]}', "messages[0]"),
                     ('{"messages": [{"role": "a", "content": "x"}], "tools": 3}', "`tools`"),
                     ('{"prompt": "x"}', "unknown: prompt"), ("{not json", "not valid JSON"),
                     ("  \n", "empty")]:
        turns.write_text(bad)
        with pytest.raises(ValueError, match=re.escape(why)):
            read_warm(turns)
    turns.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_warm(turns)
    with pytest.raises(OSError):
        read_warm(tmp_path / "missing")


def test_the_default_folder_follows_the_service_then_the_user() -> None:
    from exod.paths import prompt_cache_base

    assert prompt_cache_base({"STATE_DIRECTORY": "/var/lib/exod:/x"}, 0) == \
        Path("/var/lib/exod/prompt-cache")
    assert prompt_cache_base({"CACHE_DIRECTORY": "/home/u/.cache/exod"}, 1000) == \
        Path("/home/u/.cache/exod/prompt-cache")
    assert prompt_cache_base({}, 0) == Path("/var/lib/exod/prompt-cache")
    assert prompt_cache_base({"XDG_CACHE_HOME": "/c"}, 1000) == Path("/c/exod/prompt-cache")


def test_clearing_a_stopped_instance_empties_its_rank_folders_only(tmp_path: Path) -> None:
    from exod.daemon.cache_commands import empty

    for rank in ("rank0", "rank1"):
        (tmp_path / rank / "f").mkdir(parents=True)
        (tmp_path / rank / "f" / "e.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "weights.json").write_text("{}")
    assert empty(tmp_path) == (20, [])
    assert [p.name for p in tmp_path.iterdir()] == ["weights.json"]
    assert empty(tmp_path / "never-made") == (0, [])
