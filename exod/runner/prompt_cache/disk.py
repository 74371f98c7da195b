"""The disk tier of a rank's prompt cache: entries kept as files, across restarts and reboots.

Layout, under the instance's folder (`prompt_cache_dir`/DAEMON-ID/INSTANCE, this daemon's alone:
exod.daemon.cache_owner):
    weights.json                   hashes of the weight files, when not recorded beside them
    rank<R>/<FINGERPRINT>/<KEY>.safetensors   one entry (exod.runner.prompt_cache.entry_file)
At start a rank opens its fingerprint's folder (exod.runner.prompt_cache.fingerprint) and
removes its rank's others, whose entries could never be valid again; what stands where a
folder or an entry should be and is not one is removed as what it is, a link never followed.

All I/O runs on two worker threads (exod.runner.prompt_cache.worker), never on the serve loop,
which only matches against the shared index and pins what it loads; a read that hangs (a
network filesystem gone) holds only the request waiting for it, which a cancel or a stop ends.
Any fault (a full disk, a file cut short, corrupt or unreadable) is a miss, logged once per kind
and the file removed: never an exception out of here into a request. docs/prompt-cache.md.
"""

from __future__ import annotations

import errno
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from exod import cache_files
from exod.paths import PRIVATE, make_dirs
from exod.runner.link.log import WARNING, log
from exod.runner.prompt_cache import entry_file, fingerprint as fp
from exod.runner.prompt_cache.entry_file import EntryError, Tensor
from exod.runner.prompt_cache.index import Entry, Index, Match, Removed
from exod.runner.prompt_cache.worker import Worker

FOLDER_RE = re.compile(r"^[0-9a-f]{32}$")
MAX_RESERVE = 1 << 30  # free space a write leaves at least (less on a small filesystem)


@dataclass
class Loading:
    """A file being checked on the reader thread before the serve loop loads it."""

    entry: Entry
    path: Path
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


@dataclass
class DiskStats:
    writes: int = 0
    errors: int = 0  # faults met (each a miss or a write not made)


class DiskTier:
    def __init__(self, root: Path, rank: int, budget: int, max_queued: int = 1 << 30,
                 solo: bool = False) -> None:
        self.root = root
        self.rank = rank
        # This rank is the whole instance (no group): the prompt cache may serve an entry from
        # memory while its write is under way (exod.runner.prompt_cache.tiers), a choice that
        # a group's ranks, each with its own writer, could not make alike.
        self.solo = solo
        self.index = Index(budget)
        self.folder: Path | None = None  # this rank's folder, once known
        self.ready = False  # open: matched against and written to
        self.state = "opening"
        self.settled = threading.Event()  # open, failed, or hashing weights (takes a while)
        self.stats = DiskStats()
        self.writer = Worker("exod-cache-writer", max_queued)
        self.reader = Worker("exod-cache-reader")
        self._lock = threading.Lock()
        self._said: set[str] = set()
        self.fingerprint = ""
        self.stopping = False  # hashing ends early: the runner is stopping
        # Called on the writer thread after the tier's figures changed (the serve loop then
        # reports them: it may be waiting for a request meanwhile).
        self.on_change: Callable[[], None] = lambda: None

    # ---- opening ---------------------------------------------------------------------------
    def open(self, parts: Mapping[str, object], files: Mapping[str, Path]) -> None:
        """Find (or make) this rank's folder for these weights and settings, on the writer."""
        self.writer.submit(lambda: self._open(parts, files))

    def _open(self, parts: Mapping[str, object], files: Mapping[str, Path]) -> None:
        try:
            ranks = self.root / f"rank{self.rank}"
            for own in (self.root, ranks):  # before anything is read there
                self._own(own)
            records = fp.Records(self.root / "weights.json")
            pending = fp.to_hash(files, records)
            if pending:
                self.state = f"hashing the weights ({pending / 2**30:.1f} GiB, once)"
                self.settled.set()
                _lowest_priority()  # this thread only: requests come first
            weights, _ = fp.digest(files, records, lambda: self.stopping)
            self.fingerprint = fp.fingerprint({**parts, "weights": weights})
            self.folder = folder = ranks / self.fingerprint
            self._own(folder)
            self._remove_stale(ranks)
            self._scan(folder)
        except fp.HashingStopped:
            self.state = "stopped while hashing the weights"
        except OSError as e:
            self.state = f"off: {self.fault('open', e)}"
        else:
            self.ready = True
            self.state = "ready"
        finally:
            self.settled.set()
            self.on_change()

    def _own(self, folder: Path) -> None:
        """`folder` as a real folder of this tier, made 0700 if missing. What stands at its
        name otherwise is removed as what it is (a link as a link) and said; OSError when it
        cannot be."""
        odd = cache_files.strange(folder, want_folder=True)
        if odd is not None:
            removed = cache_files.remove(folder)
            log(f"prompt cache on disk: {folder} was {odd}: {removed.text()}", WARNING)
            if not removed.whole:
                raise OSError(errno.EEXIST, f"{odd}, and it could not be removed", str(folder))
        make_dirs(folder, PRIVATE)

    def _remove_stale(self, ranks: Path) -> None:
        """The folders of other fingerprints, with what they hold; anything else named as one
        (a link, a file) goes as what it is. Logged as it happened."""
        freed = folders = 0
        odd = []
        for other in sorted(ranks.iterdir()):
            if other.name == self.fingerprint or not FOLDER_RE.match(other.name):
                continue
            removed = cache_files.remove(other)
            if removed.what == "a folder" and removed.whole:
                freed += removed.freed
                folders += 1
            elif removed.found:
                odd.append(removed.text())
        if folders:
            log(f"prompt cache: removed {freed / 2**20:.1f} MiB in {folders} folder"
                f"{'s' if folders > 1 else ''} kept for other weights or settings ({ranks})")
        for line in odd:
            log(f"prompt cache, kept for other weights or settings: {line}", WARNING)

    def _scan(self, folder: Path) -> None:
        found: list[tuple[float, Entry]] = []
        for p in folder.iterdir():
            if p.name.endswith(entry_file.TEMP_SUFFIX):  # a write cut short by an exit
                _remove(p)
                continue
            if not p.name.endswith(entry_file.SUFFIX):
                continue
            try:
                odd = cache_files.strange(p, want_folder=False)
                if odd is not None:  # a pipe would hang the scan, a link lead out of it
                    raise EntryError(odd)
                h = entry_file.read_header(p)
                if h.metadata.get(entry_file.FINGERPRINT) != self.fingerprint:
                    raise EntryError("made under another fingerprint")
                found.append((p.lstat().st_mtime, Entry(h.tokens, h.size, h.trimmable,
                                                        payload=p.name)))
            except (EntryError, OSError) as e:
                self.fault("read", e, p, done=cache_files.remove(p).text())
        for _, entry in sorted(found, key=lambda f: f[0]):  # mtime: when last used
            if entry.payload != f"{entry.key}{entry_file.SUFFIX}":
                self._delete(entry)  # a name that is not its tokens' key: not ours
                continue
            self._apply(self.index.add(entry))

    # ---- the serve loop's side (under the lock, no I/O) --------------------------------------
    def match(self, prompt: bytes) -> Match | None:
        if not self.ready:
            return None
        with self._lock:
            return self.index.best(prompt)

    def holds(self, tokens: bytes) -> bool:
        """Whether an entry serves all `tokens` would (nothing to write for them)."""
        with self._lock:
            return self.index.covered(tokens)

    def has(self, key: str) -> bool:
        with self._lock:
            return self.index.get(key) is not None

    def get(self, key: str) -> Entry | None:
        with self._lock:
            return self.index.get(key)

    def load(self, entry: Entry) -> Loading:
        """Pin `entry` and check its file on the reader thread; the serve loop polls `done`."""
        assert self.folder is not None
        with self._lock:
            entry.pins += 1
            self.index.touch(entry)
        job = Loading(entry, self.folder / str(entry.payload))
        self.reader.submit(lambda: self._check(job))
        return job

    def loaded(self, job: Loading, ok: bool) -> None:
        """The serve loop is done with `job`: unpin it; a file that failed to load goes."""
        with self._lock:
            job.entry.pins -= 1
        if not ok:
            self.writer.submit(lambda: self._forget(job.entry))
        else:  # its mtime is its place in the LRU order after a restart
            self.writer.submit(lambda: _touch(job.path))

    # ---- on the reader thread ----------------------------------------------------------------
    def _check(self, job: Loading) -> None:
        try:
            h = entry_file.read_header(job.path)
            if h.tokens != job.entry.tokens:
                raise EntryError("its tokens are not the entry's")
            entry_file.verify(job.path, h)
        except EntryError as e:
            job.error = self.fault("read", e, job.path)
        finally:
            job.done.set()

    # ---- on the writer thread ----------------------------------------------------------------
    def write(self, tokens: bytes, trimmable: bool, tensors: Sequence[Tensor],
              metadata: dict[str, str]) -> bool:
        """Queue an entry's write (its tensors are bytes already: exod.runner.prompt_cache
        .snapshot); False when it cannot be (not open, past the budget, the queue full)."""
        nbytes = sum(t.nbytes for t in tensors)
        if not self.ready or nbytes > self.index.budget:
            return False
        return self.writer.submit(lambda: self._write(tokens, trimmable, tensors, metadata),
                                  nbytes)

    def _write(self, tokens: bytes, trimmable: bool, tensors: Sequence[Tensor],
               metadata: dict[str, str]) -> None:
        folder = self.folder
        if folder is None or not self.ready or self.holds(tokens):
            return
        entry = Entry(tokens, 0, trimmable)
        head = entry_file.header(tensors, metadata)
        entry.nbytes = entry_file.size(head, tensors)
        try:
            if entry.nbytes > self.index.budget or not self._room(folder, entry.nbytes):
                return
            entry.payload = f"{entry.key}{entry_file.SUFFIX}"
            entry_file.write(folder, str(entry.payload), head, tensors)
        except OSError as e:
            self.fault("write", e, folder)
            return
        self.stats.writes += 1
        with self._lock:
            removed = self.index.add(entry)
        self._apply(removed)
        self.on_change()

    def _room(self, folder: Path, size: int) -> bool:
        """Evict for the budget, and check the filesystem keeps its reserve after the write."""
        with self._lock:
            gone = self.index.fit(self.index.budget - size)
        for entry in gone:
            self._delete(entry)
        st = os.statvfs(folder)
        reserve = min(MAX_RESERVE, st.f_blocks * st.f_frsize // 20)
        if st.f_bavail * st.f_frsize - size < reserve:
            self.fault("write", OSError(f"the disk is nearly full ({st.f_bavail * st.f_frsize} "
                                         f"bytes free, {size} needed)"), folder)
            return False
        return True

    def clear(self) -> None:
        """Forget every entry not being loaded and delete its file; queued writes are dropped."""
        self.writer.drop()

        def go() -> None:
            with self._lock:
                gone = self.index.clear()
            for entry in gone:
                self._delete(entry)
            self.on_change()
        self.writer.submit(go)

    def _forget(self, entry: Entry) -> None:
        with self._lock:
            gone = self.index.remove(entry.key) if entry.pins == 0 else None
        if gone is not None:
            self._delete(gone)

    def _apply(self, removed: Removed) -> None:
        for entry in removed.redundant + removed.evicted:
            with self._lock:
                kept = self.index.get(entry.key) is not None  # replaced by a file of its name
            if entry.payload is not None and not kept:
                self._delete(entry)

    def _delete(self, entry: Entry) -> None:
        if self.folder is not None and entry.payload:
            why = _remove(self.folder / str(entry.payload))
            if why is not None:
                self.fault("delete", why, self.folder)

    def fault(self, what: str, e: BaseException, where: Path | None = None,
              done: str = "") -> str:
        """Count a fault and log it once per kind (a full disk would otherwise log every write;
        each damaged file is a kind of its own), with what was done about it."""
        number = e.errno if isinstance(e, OSError) else None
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        text = f"cannot {what} {where}: {why}" if where else f"cannot {what}: {why}"
        self.stats.errors += 1
        kind = f"{what}:{where if what == 'read' else ''}:{number or why}"
        if what == "write" and why.startswith("the disk is nearly full"):
            kind = "write:full"
        if kind not in self._said:
            self._said.add(kind)
            then = f"; {done}" if done else ""
            log(f"prompt cache on disk: {text} (a miss{then}; said once)", WARNING)
        return text


def _lowest_priority() -> None:
    """The calling thread at nice 19, where the system allows it (Linux: a thread is a task)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (OSError, AttributeError):
        pass


def _remove(path: Path) -> OSError | None:
    """Delete a file, or whatever took its name (a folder: nothing of ours is one; a link as
    a link)."""
    removed = cache_files.remove(path)
    return OSError(errno.EPERM, removed.text()) if removed.left else None


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass

