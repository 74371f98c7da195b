"""`/metrics` in the Prometheus text format (prometheus_client).

Two kinds of figures. What requests do (counts by status code, tokens, time to first token,
time per output token) is recorded as each request runs. Everything else (states, queue depth,
restarts, ladder rungs, load progress, uptime, reloads) is read from the daemon's live state
by a collector at scrape time, so an idle daemon that nobody scrapes does no work for metrics.
Each server has its own registry: nothing is global, and tests can run several daemons.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exod.wire import messages as m
from exod.api.ignored import IgnoredFields
from exod.api.key_metrics import key_metrics
from exod.api.view import DaemonView
from exod.core.ladder import Step
from exod.core.states import State

if TYPE_CHECKING:
    from exod.daemon.instance import InstanceRuntime

Load = Callable[["InstanceRuntime"], tuple[int, int]]  # (at the runner, waiting)

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Seconds. Small models on a CPU answer in tens of milliseconds; big ones take many seconds.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5)
INPUT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


@dataclass
class InstanceStats:
    """Request figures of one instance, kept by name: they outlive a reload's replacement."""

    requests: collections.Counter[str] = field(default_factory=collections.Counter)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    inputs: int = 0  # of embeddings and rerank requests (a rerank's: its documents)


class Metrics:
    def __init__(self, daemon: DaemonView, load: Load) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.stats: dict[str, InstanceStats] = collections.defaultdict(InstanceStats)
        self.ignored = IgnoredFields()
        self.ttft = Histogram(
            "exod_time_to_first_token_seconds", "From a request's arrival (queueing included) to "
            "its first generated text", ["instance"], buckets=TTFT_BUCKETS,
            registry=self.registry)
        self.tpot = Histogram(
            "exod_time_per_output_token_seconds", "Mean time between generated tokens, one "
            "observation per request that generated two tokens or more", ["instance"],
            buckets=TPOT_BUCKETS, registry=self.registry)
        self.inputs = Histogram(
            "exod_embedding_inputs_per_request", "Inputs of an embeddings request (documents "
            "of a rerank request)", ["instance"], buckets=INPUT_BUCKETS,
            registry=self.registry)
        self.registry.register(LiveCollector(daemon, load, self.stats, self.ignored))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def meter(self) -> Meter:
        return Meter(self, time.monotonic())


class Meter:
    """Follows one generation request: `label` it with the instance the daemon admitted it to
    (or refused it for), feed it each runner event, then `finish` it. A request the daemon
    found no instance for stays unlabelled and uncounted: no label for any name a client
    sends."""

    def __init__(self, metrics: Metrics, arrived: float) -> None:
        self.metrics = metrics
        self.instance: str | None = None
        self.arrived = arrived
        self._inputs = 0  # an embeddings request's inputs, before it is labelled
        self.first: float | None = None
        self.counted = 0  # text and held events: a token each, until `done` gives the total
        self.failed_code: int | None = None  # an error after the 200 went out (streams)
        self.status = 499  # the answer's, once there is one (until then: the client left)

    def label(self, instance: str | None) -> None:
        self.instance = instance
        if self._inputs:
            self.inputs(self._inputs)

    def inputs(self, n: int) -> None:
        """An embeddings or rerank request of `n` inputs (counted even if it is refused)."""
        if self.instance is None:
            self._inputs = n  # until the daemon names the instance
            return
        self._inputs = 0
        self.metrics.stats[self.instance].inputs += n
        self.metrics.inputs.labels(self.instance).observe(n)

    def event(self, ev: m.Event) -> None:
        if self.instance is None:
            return
        now = time.monotonic()
        stats = self.metrics.stats[self.instance]
        if isinstance(ev, (m.Text, m.Held)):
            # Counted as they come, so rates are live during a long generation; Done then
            # brings the count to the runner's exact figure (a piece may hold several tokens).
            stats.generated_tokens += 1
            self.counted += 1
            if self.first is None:
                self.first = now
                self.metrics.ttft.labels(self.instance).observe(now - self.arrived)
        elif isinstance(ev, m.Done):
            generated = max(0, ev.completion_tokens)
            stats.prompt_tokens += max(0, ev.prompt_tokens)
            stats.generated_tokens += max(0, generated - self.counted)
            if self.first is not None and generated >= 2:
                self.metrics.tpot.labels(self.instance).observe(
                    (now - self.first) / (generated - 1))

    def finish(self, status: int) -> None:
        if self.instance is None:
            return
        code = self.failed_code if status == 200 and self.failed_code else status
        self.metrics.stats[self.instance].requests[str(code)] += 1


class LiveCollector(Collector):
    def __init__(self, daemon: DaemonView, load: Load, stats: dict[str, InstanceStats],
                 ignored: IgnoredFields) -> None:
        self.daemon = daemon
        self.load = load
        self.stats = stats
        self.ignored = ignored

    def collect(self) -> Iterator[Metric]:
        d = self.daemon
        yield GaugeMetricFamily("exod_uptime_seconds", "Seconds since the daemon started",
                                value=time.monotonic() - d.started)
        reloads = CounterMetricFamily("exod_reloads", "Configuration reloads, by result",
                                      labels=["result"])
        for result, n in sorted(d.reloader.reloads.items()):
            reloads.add_metric([result], n)
        yield reloads
        yield CounterMetricFamily("exod_config_errors", "Problems found in configurations "
                                  "that reloads refused", value=d.reloader.config_errors)
        yield from self._instances(list(d.ordered()))
        yield from self._requests()
        yield from key_metrics(d.usage)
        ignored = CounterMetricFamily("exod_ignored_fields", "Request fields accepted and not "
                                      "used (unknown, or naming a tool exod does not run), by "
                                      "dialect and field path", labels=["dialect", "field"])
        for (dialect, name), n in sorted(self.ignored.counts.items()):
            ignored.add_metric([dialect, name], n)
        yield ignored

    def _instances(self, instances: list[InstanceRuntime]) -> Iterator[Metric]:
        label = ["instance"]
        state = GaugeMetricFamily("exod_instance_state", "1 for the state the instance is in",
                                  labels=["instance", "state"])
        restarts = CounterMetricFamily("exod_instance_restarts", "Automatic restarts", labels=label)
        rungs = CounterMetricFamily("exod_ladder_steps", "Termination ladder steps taken, by rung "
                                    "(ask, SIGTERM, SIGKILL)", labels=["instance", "rung"])
        queued = GaugeMetricFamily("exod_queue_depth", "Requests waiting for a slot", labels=label)
        active = GaugeMetricFamily("exod_requests_in_flight", "Requests at the runner",
                                   labels=label)
        loaded = GaugeMetricFamily("exod_load_layers_loaded", "Layers loaded by the local ranks",
                                   labels=label)
        total = GaugeMetricFamily("exod_load_layers_total", "Layers the local ranks load",
                                  labels=label)
        for inst in instances:
            name = inst.name
            for s in State:
                state.add_metric([name, s.value], 1.0 if inst.state is s else 0.0)
            restarts.add_metric([name], inst.tracker.restarts)
            for step in Step:
                rungs.add_metric([name, step.value], inst.group.rungs_used[step.value])
            at_runner, waiting = self.load(inst)
            queued.add_metric([name], waiting)
            active.add_metric([name], at_runner)
            local = [r for r in inst.ranks if r.local]
            loaded.add_metric([name], sum(r.layers_loaded for r in local))
            total.add_metric([name], sum(r.layers_total for r in local))
        yield from (state, restarts, rungs, queued, active, loaded, total)
        yield from self._downloads(instances)
        yield from self._prompt_cache(instances)
        yield from self._speculative(instances)
        yield from self._batches(instances)

    def _downloads(self, instances: list[InstanceRuntime]) -> Iterator[Metric]:
        """The model download an instance waits for (only while it is downloading)."""
        label = ["instance"]
        done = GaugeMetricFamily("exod_download_bytes", "Bytes of the model on disk, while "
                                 "downloading", labels=label)
        total = GaugeMetricFamily("exod_download_total_bytes", "Bytes of the model files, while "
                                  "downloading", labels=label)
        rate = GaugeMetricFamily("exod_download_bytes_per_second", "Download rate over the last "
                                 "seconds", labels=label)
        for inst in instances:
            d = inst.download
            if d is not None:
                done.add_metric([inst.name], d.progress.done)
                total.add_metric([inst.name], d.progress.total)
                rate.add_metric([inst.name], d.progress.rate() or 0.0)
        yield from (done, total, rate)

    def _prompt_cache(self, instances: list[InstanceRuntime]) -> Iterator[Metric]:
        """Rank 0's prompt cache, as its runner last reported (counted since it started), per
        tier: a lookup is served by RAM, else by disk, else it is a miss of both (a RAM miss
        is a lookup RAM did not serve; a disk miss, one neither served)."""
        label, tiered = ["instance"], ["instance", "tier"]
        lookups = CounterMetricFamily("exod_prompt_cache_lookups", "Prompts looked up in the "
                                      "prompt cache", labels=label)
        hits = CounterMetricFamily("exod_prompt_cache_hits", "Lookups served from this tier",
                                   labels=tiered)
        misses = CounterMetricFamily("exod_prompt_cache_misses", "Lookups that reached this "
                                     "tier and were not served from it", labels=tiered)
        cached = CounterMetricFamily("exod_prompt_cache_tokens", "Prompt tokens taken from this "
                                     "tier instead of prefilled", labels=tiered)
        size = GaugeMetricFamily("exod_prompt_cache_bytes", "Bytes this tier holds",
                                 labels=tiered)
        entries = GaugeMetricFamily("exod_prompt_cache_entries", "Entries this tier holds",
                                    labels=tiered)
        load = CounterMetricFamily("exod_prompt_cache_load_seconds", "Time spent loading the "
                                   "entries served from this tier", labels=tiered)
        for inst in instances:
            s = inst.ranks[0].serving if inst.ranks else None
            if s is None:
                continue
            name = inst.name
            lookups.add_metric([name], s.cache_lookups)
            tiers = [("ram", s.cache_hits, s.cached_tokens, s.cache_bytes, s.cache_entries, 0.0)]
            if s.disk_max_bytes:
                tiers.append(("disk", s.disk_hits, s.disk_cached_tokens, s.disk_bytes,
                              s.disk_entries, s.disk_load_ms / 1000))
            # Not a store: a prefix copied from a request still in flight (shared_prefix).
            tiers.append(("shared", s.shared_hits, s.shared_tokens, 0, 0, 0.0))
            reached = s.cache_lookups
            for tier, n, tokens, nbytes, held, seconds in tiers:
                hits.add_metric([name, tier], n)
                misses.add_metric([name, tier], max(0, reached - n))
                reached -= n
                cached.add_metric([name, tier], tokens)
                size.add_metric([name, tier], nbytes)
                entries.add_metric([name, tier], held)
                load.add_metric([name, tier], seconds)
        yield from (lookups, hits, misses, cached, size, entries, load)

    def _speculative(self, instances: list[InstanceRuntime]) -> Iterator[Metric]:
        """Speculative decoding on rank 0 (counted since it started): the acceptance rate is
        rate(accepted) / rate(drafted)."""
        label = ["instance"]
        yield from _per_runner(instances, lambda s: bool(s.draft_tokens), [
            (CounterMetricFamily("exod_draft_tokens", "Draft tokens the model checked "
                                 "(speculative decoding)", labels=label), lambda s: s.drafted),
            (CounterMetricFamily("exod_draft_tokens_accepted", "Draft tokens the model "
                                 "accepted (speculative decoding)", labels=label),
             lambda s: s.draft_accepted)])

    def _batches(self, instances: list[InstanceRuntime]) -> Iterator[Metric]:
        """An embedding model's or a reranker's batches (counted since its runner started):
        the mean batch size is rate(inputs) / rate(batches)."""
        label = ["instance"]
        yield from _per_runner(instances, lambda s: bool(s.batches), [
            (CounterMetricFamily("exod_embedding_batches", "Forward passes of an embedding "
                                 "model or a reranker", labels=label), lambda s: s.batches),
            (CounterMetricFamily("exod_embedding_batched_inputs", "Inputs those passes held, "
                                 "from every request in flight", labels=label),
             lambda s: s.batched_inputs)])

    def _requests(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("exod_requests", "Generation requests answered, by HTTP "
                                       "status code (499: the client left)",
                                       labels=["instance", "code"])
        prompt = CounterMetricFamily("exod_prompt_tokens", "Prompt tokens processed",
                                     labels=["instance"])
        generated = CounterMetricFamily("exod_generated_tokens", "Tokens generated",
                                        labels=["instance"])
        inputs = CounterMetricFamily("exod_embedding_inputs", "Inputs of embeddings requests "
                                     "(documents of rerank requests)", labels=["instance"])
        for name, s in sorted(self.stats.items()):
            for code, n in sorted(s.requests.items()):
                requests.add_metric([name, code], n)
            prompt.add_metric([name], s.prompt_tokens)
            generated.add_metric([name], s.generated_tokens)
            if s.inputs:
                inputs.add_metric([name], s.inputs)
        yield from (requests, prompt, generated, inputs)


def _per_runner(instances: list[InstanceRuntime], counts: Callable[[m.ServingReport], bool],
                families: list[tuple[CounterMetricFamily, Callable[[m.ServingReport], int]]]
                ) -> Iterator[Metric]:
    """Counters of each instance's rank 0 (as its last Serving report says), for the
    instances where `counts`: each family with its value."""
    for inst in instances:
        s = inst.ranks[0].serving if inst.ranks else None
        if s is not None and counts(s):
            for family, value in families:
                family.add_metric([inst.name], value(s))
    yield from (family for family, _ in families)
