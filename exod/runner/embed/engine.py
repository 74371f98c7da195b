"""The serving engine of an embedding model or a reranker: the inputs of every request in flight
batched together, a bounded batch a step (exod.runner.serving.loop's Engine).

A request's inputs wait in one queue, the oldest request's first, each request's longest first.
A step takes inputs from the front while the padded batch (inputs x the longest of them) stays
within `batch_tokens` and `max_batch` inputs (one input longer than the budget runs alone), cuts
it into a part per core of inputs of like length (`split`), runs the parts at once
(exod.runner.embed.encoder) and sends their results (Vectors) together; a request is Done when
its last input is. So many small requests that arrive together share a step, a large one is cut
into batches of inputs of like length (little padding), every core computes, and a cancel or a
stop waits one bounded step at most.
"""

from __future__ import annotations

import base64
import collections
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exod.wire import messages as m
from exod.facts.embed import Encoding
from exod.core.request_rules import RequestError
from exod.runner.embed.inputs import Inputs, read_inputs
from exod.runner.serving.loop import AsItComes, NoPromptCache
from exod.runner.embed.part import Part

if TYPE_CHECKING:  # mlx: only where a model runs (this module's pure parts are unit-tested)
    from exod.runner.embed.encoder import Encoder

BATCHING = "dynamic: the inputs of every request in flight, batched by length"


@dataclass
class Job:
    """One request in the engine."""

    req: m.Embed
    inputs: Inputs
    left: int  # inputs not computed yet
    started: bool = False  # some of its results have gone out


@dataclass(frozen=True)
class Item:
    """One input waiting: its request, its place in it, its length."""

    rid: str
    index: int
    length: int


def plan(queue: collections.deque[Item], batch_tokens: int, max_batch: int) -> list[Item]:
    """The inputs of the next batch, taken from the front of `queue` (which keeps the rest)."""
    batch: list[Item] = []
    longest = 0
    while queue and len(batch) < max_batch:
        item = queue[0]
        width = max(longest, item.length)
        if batch and (len(batch) + 1) * width > batch_tokens:
            break
        batch.append(queue.popleft())
        longest = width
    return batch


def split(lengths: list[int], parts: int) -> list[list[int]]:
    """A batch's inputs (their places in it) in at most `parts` groups, one per core: runs of
    the inputs sorted longest first, so that each group pads little, cut where the largest
    group's padded tokens (its inputs x its longest) are fewest. An input's vector does not
    depend on its group, so any cut gives the same results."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if parts <= 1 or len(order) <= 1:
        return [order]

    def cut(most: int) -> list[list[int]]:  # greedy runs of at most `most` padded tokens
        groups: list[list[int]] = [[]]
        for i in order:
            run = groups[-1]
            if run and (len(run) + 1) * lengths[run[0]] > most:
                groups.append(run := [])
            run.append(i)
        return groups

    low, high = lengths[order[0]], len(order) * lengths[order[0]]  # one input; all in one
    while low < high:  # the least bound that needs no more than `parts` groups
        mid = (low + high) // 2
        if len(cut(mid)) <= parts:
            high = mid
        else:
            low = mid + 1
    return cut(low)


@dataclass
class Figures:
    batches: int = 0
    inputs: int = 0


class EmbedEngine(NoPromptCache, AsItComes):
    def __init__(self, encoder: Encoder, tokenizer: object, vocab: int, width: int,
                 batch_tokens: int, max_batch: int) -> None:
        self.encoder = encoder
        self.enc: Encoding = encoder.enc
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.width = width
        self.batch_tokens = batch_tokens
        self.max_batch = max_batch
        self.jobs: dict[str, Job] = {}
        self.queue: collections.deque[Item] = collections.deque()
        self.figures = Figures()

    @property
    def active(self) -> int:
        return len(self.jobs)

    def read(self, req: m.Embed) -> Inputs:
        return read_inputs(self.tokenizer, self.enc, self.vocab, req)

    def admit(self, req: m.Embed, inputs: Inputs) -> None:
        if req.id in self.jobs:
            raise RequestError(f"request id {req.id} is already in flight")
        self.jobs[req.id] = Job(req, inputs, len(inputs.ids))
        order = sorted(range(len(inputs.ids)), key=lambda i: -len(inputs.ids[i]))
        self.queue.extend(Item(req.id, i, len(inputs.ids[i])) for i in order)

    def cancel(self, rid: str) -> None:
        if self.jobs.pop(rid, None) is not None:
            self.queue = collections.deque(i for i in self.queue if i.rid != rid)

    def step(self) -> list[m.Event]:
        batch = plan(self.queue, self.batch_tokens, self.max_batch)
        if not batch:
            return []
        groups = [[batch[k] for k in g]
                  for g in split([i.length for i in batch], self.encoder.threads)]
        results = self.encoder.run_all([self._part(g) for g in groups])
        self.figures.batches += 1
        self.figures.inputs += len(batch)
        events: list[m.Event] = []
        done: list[str] = []
        by_job: dict[str, list[tuple[int, bytes]]] = {}
        for group, out in zip(groups, results, strict=True):
            for item, data in zip(group, out, strict=True):
                by_job.setdefault(item.rid, []).append((item.index, data))
        for rid, got in by_job.items():
            job = self.jobs[rid]
            job.started = True
            job.left -= len(got)
            events += vectors(rid, got)
            if job.left == 0:
                events.append(m.Done(rid, "stop", job.inputs.tokens, 0))
                done.append(rid)
        for rid in done:
            del self.jobs[rid]
        return events

    def _part(self, items: list[Item]) -> Part:
        """What the encoder runs for these inputs: their ids, type ids, and vector sizes."""
        jobs = [self.jobs[i.rid] for i in items]
        ids = [j.inputs.ids[i.index] for i, j in zip(items, jobs, strict=True)]
        types = None
        if any(j.inputs.types is not None for j in jobs):
            types = [j.inputs.types[i.index] if j.inputs.types is not None else [0] * i.length
                     for i, j in zip(items, jobs, strict=True)]
        return Part(ids, types, [j.req.dimensions for j in jobs])

    def abort_all(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        events: list[m.Event] = [m.Error(rid, code, message) for rid in self.jobs]
        self.jobs.clear()
        self.queue.clear()
        return events

    def abort_prefilling(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        """The requests none of whose results has gone out yet (the others finish, within the
        drain)."""
        waiting = [rid for rid, job in self.jobs.items() if not job.started]
        for rid in waiting:
            self.cancel(rid)
        return [m.Error(rid, code, message) for rid in waiting]

    def serving(self) -> m.ServingReport:
        return m.ServingReport(batching=BATCHING, width=self.width, active=len(self.jobs),
                         prefill_step=self.batch_tokens, batches=self.figures.batches,
                         batched_inputs=self.figures.inputs)


def vectors(rid: str, got: list[tuple[int, bytes]]) -> list[m.Event]:
    """Results as Vectors events of consecutive inputs, each within a runner's frame."""
    got.sort()
    events: list[m.Event] = []
    run: list[tuple[int, bytes]] = []

    def flush() -> None:
        if run:
            data = b"".join(little_endian(d) for _, d in run)
            events.append(m.Vectors(rid, run[0][0], len(run), base64.b64encode(data).decode()))
            run.clear()

    size = 0
    for index, data in got:
        if run and (index != run[-1][0] + 1 or size + len(data) > m.VECTORS_BYTES):
            flush()
            size = 0
        run.append((index, data))
        size += len(data)
    flush()
    return events


def little_endian(data: bytes) -> bytes:
    """float32 bytes in the machine's order, as the wire carries them (little-endian)."""
    if sys.byteorder == "little":
        return data
    import array

    a = array.array("f", data)
    a.byteswap()
    return a.tobytes()
