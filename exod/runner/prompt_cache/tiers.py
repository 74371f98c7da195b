"""A rank's prompt cache in two tiers, as the batch engine uses it: RAM, then disk.

RAM holds entries (a request's KV cache, under its tokens) up to `prompt_cache_bytes`; disk
(exod.runner.prompt_cache.disk) up to `prompt_cache_disk_bytes`. A lookup takes the entry that
covers the most of the prompt in either tier: from RAM a copy at once; from disk a `FromDisk`
load, which the engine steps like prefill and can drop at any step (a cancel, a stop). Entries
go to disk behind the requests (evicted, idle, and at the stop: `flush`, bounded by a deadline);
only the arrays' bytes cross to the writer thread, and no request ever waits for a write.

An entry evicted to disk is in neither tier until its write ends (seconds for the gigabytes of
an agent's prompt, longer than an agent takes to run a tool and send its next turn), though its
arrays are in memory all along, held by the write. On a rank alone (`DiskTier.solo`) such
entries are matched as RAM's are (`writing`) until they are on disk, so the agent's next turn
reuses its KV instead of prefilling it whole. A group's ranks do not: each has its own writer,
so they could not agree on what is still there. docs/prompt-cache.md.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from exod.runner.link.log import WARNING, log
from exod.runner.prompt_cache import entry_file, snapshot
from exod.runner.prompt_cache.disk import DiskTier, Loading
from exod.runner.prompt_cache.fingerprint import FORMAT_VERSION
from exod.runner.prompt_cache.index import ITEM, Entry, Index, Match, pack

HUGE = 1 << 62  # a group's other ranks never evict by their own bytes (exod.runner.group.lockstep)


@dataclass
class Counts:
    """Since the runner started."""

    lookups: int = 0
    prompt_tokens: int = 0  # of every lookup
    ram_hits: int = 0
    ram_tokens: int = 0  # prompt tokens taken from RAM instead of prefilled
    disk_hits: int = 0
    disk_tokens: int = 0
    disk_load_s: float = 0.0  # spent loading entries that hit
    shared_hits: int = 0  # prompts started from a copy of another's in flight
    shared_tokens: int = 0


@dataclass
class FromDisk:
    """A disk entry on its way into a request's cache: checked on the reader thread, then read
    (mx.load's arrays evaluated) a bounded number of bytes per engine step."""

    match: Match | None  # None: `missing`
    job: Loading | None
    started: float = field(default_factory=time.monotonic)
    cache: list[Any] | None = None
    arrays: list[mx.array] = field(default_factory=list)
    total: int = 0  # bytes to read
    done: int = 0
    failed: str | None = None
    ready: bool = False

    @classmethod
    def missing(cls) -> FromDisk:
        """Rank 0's choice, which this rank does not hold: a miss for the whole group."""
        return cls(None, None, failed="not held by this rank")

    def advance(self, budget: int) -> int:
        """Read up to `budget` bytes (at least one array); the bytes read."""
        if self.failed is not None or self.ready or self.job is None or self.match is None:
            return 0
        try:
            if self.cache is None:
                if not self.job.done.is_set():
                    return 0
                if self.job.error is not None:
                    self.failed = self.job.error
                    return 0
                self.cache, self.arrays = snapshot.load(self.job.path)
                self.total = sum(a.nbytes for a in self.arrays)
            spent = 0
            while self.arrays and (spent == 0 or spent < budget):
                a = self.arrays.pop(0)
                mx.eval(a)
                spent += a.nbytes
            self.done += spent
            if not self.arrays:
                if self.match.trim:
                    trim_prompt_cache(self.cache, self.match.trim)
                self.ready = True
            return spent
        except Exception as e:  # noqa: BLE001 -- mlx raises many types on a bad file
            self.failed = f"cannot load {self.job.path}: {type(e).__name__}: {e}"
            return 0

    @property
    def progress(self) -> float:
        return self.done / self.total if self.total else 0.0


# A match covering fewer tokens of a longer prompt is no hit: copying (or loading) an entry of
# thousands of tokens to reuse a chat template's first few costs more than prefilling them, and
# a prompt that starts from a stored cache is computed otherwise than cold (a quantized one, say)
# for nothing. A short prompt asked again is a hit (all of it that can be, but its last token).
MIN_HIT = 8


def worth(match: Match | None, packed: bytes) -> Match | None:
    if match is None:
        return None
    whole = len(packed) // ITEM - 1  # the most a prompt can take from a cache
    return match if match.usable >= min(MIN_HIT, whole) else None


class PromptCache:
    def __init__(self, ram_bytes: int, disk: DiskTier | None = None) -> None:
        self.ram = Index(max(0, ram_bytes))
        self.disk = disk
        # Entries evicted from RAM whose write to disk has not ended (see the module's doc).
        self.writing = Index(HUGE)
        self.counts = Counts()
        self._sent: set[str] = set()  # RAM entries handed to the disk writer
        self._said: set[str] = set()

    @property
    def enabled(self) -> bool:
        return self.ram.budget > 0 or self.disk is not None

    # ---- lookups -------------------------------------------------------------------------------
    def lookup(self, prompt: list[int]) -> tuple[list[Any] | None, int, FromDisk | None]:
        """(a copy of the RAM entry to start from, the tokens it covers, or a disk load)."""
        self.counts.lookups += 1
        self.counts.prompt_tokens += len(prompt)
        if not self.enabled:
            return None, 0, None
        packed = pack(prompt)
        ram = self._best_in_memory(packed)
        on_disk = worth(self.disk.match(packed), packed) if self.disk is not None else None
        if on_disk is not None and on_disk.usable > (ram.usable if ram else 0):
            return None, 0, self.load(on_disk)
        return self._from_ram(ram)

    def disk_choice(self, prompt: list[int]) -> Match | None:
        """The disk entry `lookup` would load for `prompt` (nothing counted, nothing loaded)."""
        if self.disk is None:
            return None
        packed = pack(prompt)
        ram = self._best_in_memory(packed)
        on_disk = worth(self.disk.match(packed), packed)
        return on_disk if on_disk is not None and on_disk.usable > (ram.usable if ram else 0) \
            else None

    def ram_only(self, prompt: list[int], counted: bool = True
                 ) -> tuple[list[Any] | None, int]:
        """RAM's best for `prompt` (a disk load failed, another rank chose RAM, a warm-up);
        `counted`: a hit counts as one (a warm-up's does not)."""
        cache, covered, _ = self._from_ram(self._best_in_memory(pack(prompt)) if self.enabled
                                           else None, counted)
        return cache, covered

    def disk_by_key(self, key: str, usable: int) -> FromDisk | None:
        """The disk entry `key` loaded to cover `usable` tokens, as rank 0 chose it for the
        group; None when this rank does not hold it (a miss for every rank)."""
        entry = self.disk.get(key) if self.disk is not None and self.disk.ready else None
        if entry is None or usable > entry.length:
            return None
        return self.load(Match(entry, usable, entry.length - usable))

    def load(self, match: Match) -> FromDisk:
        assert self.disk is not None
        return FromDisk(match, self.disk.load(match.entry))

    def loaded(self, load: FromDisk, used: bool = True) -> None:
        """A disk load is over: a hit when it worked and the request starts from it (counted),
        else its file goes (unless another rank was at fault: then it stays). `used` False: a
        group's other rank could not load its part, so every rank starts without it, and this
        rank's own load, even a whole one, is no hit."""
        ok = load.ready and load.failed is None
        if self.disk is not None and load.job is not None:
            if load.failed is not None and load.job.error is None:  # mlx's, not the check's
                self.disk.fault("load", OSError(load.failed))
            self.disk.loaded(load.job, ok or load.failed is None)
        if ok and used and load.match is not None:
            self.counts.disk_hits += 1
            self.counts.disk_tokens += load.match.usable
            self.counts.disk_load_s += time.monotonic() - load.started

    def dropped(self, load: FromDisk) -> None:
        """A load given up before its end (a cancel, a stop): the file stays."""
        if self.disk is not None and load.job is not None:
            self.disk.loaded(load.job, ok=True)

    def _best_in_memory(self, packed: bytes) -> Match | None:
        """RAM's best match, or an entry's still being written when it covers more."""
        best = self.ram.best(packed)
        if self._written():
            return worth(best, packed)
        held = self.writing.best(packed)
        if held is not None and (best is None or held.usable > best.usable):
            return worth(held, packed)
        return worth(best, packed)

    def _written(self) -> bool:
        """Forget the entries whose write ended (on disk now, or given up); whether none is
        left being written."""
        disk = self.disk
        if not len(self.writing):
            return True
        if disk is None or not disk.solo or disk.writer.idle:
            self.writing.clear()
            return True
        for entry in self.writing:
            if disk.holds(entry.tokens):
                self.writing.remove(entry.key)
        return not len(self.writing)

    def _from_ram(self, ram: Match | None, counted: bool = True
                  ) -> tuple[list[Any] | None, int, FromDisk | None]:
        if ram is None:
            return None, 0, None
        self.ram.touch(ram.entry)
        cache = copy.deepcopy(ram.entry.payload)
        if ram.trim:
            trim_prompt_cache(cache, ram.trim)
        if counted:
            self.counts.ram_hits += 1
            self.counts.ram_tokens += ram.usable
        return cache, ram.usable, None

    # ---- storing ---------------------------------------------------------------------------
    def store(self, tokens: list[int], cache: list[Any]) -> None:
        """Keep a request's cache under its tokens. What RAM evicts for it goes to disk."""
        if not self.enabled or not tokens or not cache:
            return
        snapshot.prepare(cache)
        entry = Entry(pack(tokens), snapshot.nbytes(cache), snapshot.trimmable(cache),
                      payload=cache)
        removed = self.ram.add(entry)
        self._left(removed.evicted, removed.redundant)

    def trim_to(self, entries: int) -> None:
        """A group's other ranks keep rank 0's entry count (see HUGE)."""
        self._left(self.ram.fit(HUGE, count=entries))

    def holds(self, tokens: list[int]) -> bool:
        """Whether a prompt that goes on past `tokens` would find them all (but the last, for a
        cache that cannot be trimmed) in either tier."""
        probe = pack([*tokens, 0xFFFFFFFF])  # no token is this one
        found = [self._best_in_memory(probe), self.disk.match(probe) if self.disk else None]
        return any(m is not None and m.usable >= len(tokens) - 1 for m in found)

    def follow(self) -> None:
        self.ram.budget = HUGE

    def idle(self) -> None:
        """Nothing to serve: what RAM holds and disk does not yet goes to the writer, the most
        recently used first."""
        for entry in reversed(list(self.ram)):
            self._to_disk(entry)

    def flush(self, deadline: float) -> None:
        """The stop: write what is not on disk yet, until `deadline` (time.monotonic); what is
        not written by then is dropped (never waited for past it)."""
        if self.disk is None or not self.disk.ready:
            return
        self.idle()
        if not self.disk.writer.drain(deadline):
            n = self.disk.writer.drop()
            log(f"prompt cache: {n} entr{'y' if n == 1 else 'ies'} not written to disk before "
                "the stop's deadline (dropped)", WARNING)

    def clear(self) -> None:
        self.ram.clear()
        self.writing.clear()
        self._sent.clear()
        if self.disk is not None:
            self.disk.clear()

    def _left(self, evicted: list[Entry], redundant: list[Entry] | None = None) -> None:
        """Entries out of RAM: the evicted ones go to disk (a redundant one is served by the
        entry that replaced it)."""
        for gone in evicted:
            if self._to_disk(gone) and self.disk is not None and self.disk.solo:
                self.writing.add(gone)  # its arrays stay in memory until written anyway
        for gone in evicted + (redundant or []):
            if self.ram.get(gone.key) is None:
                self._sent.discard(gone.key)

    def _to_disk(self, entry: Entry) -> bool:
        """Hand `entry` to the disk's writer; whether a write of it was queued now."""
        disk = self.disk
        if disk is None or not disk.ready or entry.key in self._sent:
            return False
        self._sent.add(entry.key)
        if disk.holds(entry.tokens):
            return False
        cache = entry.payload
        why = snapshot.unstorable(cache)
        if why is not None:
            if why not in self._said:
                self._said.add(why)
                log(f"prompt cache: not kept on disk: {why} (load_prompt_cache could not read "
                    "it back)", WARNING)
            return False
        meta = entry_file.exod_metadata(entry.tokens, entry.trimmable, disk.fingerprint,
                                        FORMAT_VERSION)
        tensors, meta = snapshot.tensors(cache, meta)
        # Or dropped (the writer's queue full): never waited for.
        return disk.write(entry.tokens, entry.trimmable, tensors, meta)
