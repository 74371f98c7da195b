"""Each key's figures in /metrics, per key and instance, read at scrape time from the daemon's
usage keeper (exod.daemon.usage.keeper): counted since the daemon started, as a request ends.
Key names come from the config (`api.keys`, "token", "anonymous"), never from a client, so the
labels are bounded."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exod.daemon.usage.keeper import UsageKeeper


def key_metrics(usage: UsageKeeper) -> Iterator[Metric]:
    labels = ["key", "instance"]
    requests = CounterMetricFamily("exod_key_requests", "Generation requests of each key that "
                                   "an instance took, ended (any status)", labels=labels)
    prompt = CounterMetricFamily("exod_key_prompt_tokens", "Prompt tokens of each key's "
                                 "requests", labels=labels)
    cached = CounterMetricFamily("exod_key_cached_tokens", "Of those, the tokens taken from "
                                 "the prompt cache", labels=labels)
    completion = CounterMetricFamily("exod_key_completion_tokens", "Completion tokens of each "
                                     "key's requests", labels=labels)
    batch = CounterMetricFamily("exod_key_batch_seconds", "Time each key's requests spent on "
                                "the batch, from the runner's first word on one to its end",
                                labels=labels)
    for (key, instance), s in sorted(usage.totals.items()):
        requests.add_metric([key, instance], s.requests)
        prompt.add_metric([key, instance], s.prompt_tokens)
        cached.add_metric([key, instance], s.cached_tokens)
        completion.add_metric([key, instance], s.completion_tokens)
        batch.add_metric([key, instance], s.batch_seconds)
    in_flight = GaugeMetricFamily("exod_key_requests_in_flight", "Requests of each key under "
                                  "way (let in by its limits, not ended)", labels=["key"])
    for key, state in sorted(usage.gate.keys.items()):
        in_flight.add_metric([key], state.in_flight)
    yield from (requests, prompt, cached, completion, batch, in_flight)
