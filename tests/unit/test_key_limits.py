"""A key's limits as pure logic, on an injected clock: the per-minute token buckets, the UTC
calendar quotas, the gate that lets a request in once, and the refusals as clients read them
(exod.api.limit_errors)."""

from __future__ import annotations

import datetime as dt

import pytest

from exod.api.dialects.anthropic.request import error_body, error_status
from exod.api.limit_errors import go_duration, limited
from exod.core.keys import ApiKey, KeyLimits
from exod.core.usage.bucket import TokenBucket
from exod.core.usage.calendar import iso, parse_iso, window, window_end
from exod.core.usage.gate import KeyGate, Limited
from exod.core.usage.quota import Quotas
from exod.core.usage.recent import Recent

UTC = dt.timezone.utc


def at(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


NOON = at("2025-06-30T12:00:00")


def key(**limits: int) -> ApiKey:
    return ApiKey("alice", limits=KeyLimits(**limits))  # type: ignore[arg-type]


# ---- buckets ---------------------------------------------------------------------------------
def test_a_bucket_refills_at_its_limit_a_minute_and_goes_below_zero_when_overspent() -> None:
    b = TokenBucket.full(600, now=0.0)  # 10 tokens a second
    b.spend(900, 0.0)  # a prompt counted after it was let in: 300 in debt
    assert not b.allows(0.0) and b.remaining(0.0) == 0
    assert b.wait(0.0) == pytest.approx(30.1)  # back to one token
    assert not b.allows(30.0) and b.allows(30.1)
    assert b.until_full(30.1) == pytest.approx(59.9)
    assert b.remaining(1000.0) == 600  # never more than full


def test_a_reload_that_changes_the_limit_keeps_what_was_spent() -> None:
    b = TokenBucket.full(100, 0.0)
    b.spend(80, 0.0)
    b.resize(200, 0.0)
    assert b.remaining(0.0) == 120
    b.resize(50, 0.0)
    assert b.remaining(0.0) == 0 and not b.allows(0.0)


# ---- the calendar -----------------------------------------------------------------------------
def test_quota_windows_are_utc_days_and_months() -> None:
    assert window("day", NOON) == "2025-06-30" and window("month", NOON) == "2025-06"
    assert window_end("day", NOON) == at("2025-07-01T00:00:00")
    assert window_end("month", NOON) == at("2025-07-01T00:00:00")
    assert window_end("month", at("2025-12-31T23:59:59")) == at("2026-01-01T00:00:00")
    assert iso(at("2025-07-01T00:00:00")) == "2025-07-01T00:00:00Z"
    assert parse_iso(iso(NOON + 0.25)) == NOON + 0.25
    with pytest.raises(ValueError):
        parse_iso("2025-07-01T00:00:00")  # no zone: no moment


def test_quotas_keep_the_newest_window_only() -> None:
    q = Quotas()
    q.add("a", 10, NOON)
    q.add("a", 5, NOON - 86400)  # yesterday's record, read late: this month, not today
    assert q.used("a", "day", NOON) == 10 and q.used("a", "month", NOON) == 15
    q.add("a", 7, NOON + 86400)  # July 1st: a new day and a new month
    assert q.used("a", "day", NOON + 86400) == 7 and q.used("a", "month", NOON + 86400) == 7
    assert q.used("a", "day", NOON) == 0  # what was June 30th's is gone
    assert q.used("b", "day", NOON) == 0


# ---- the gate -------------------------------------------------------------------------------
def test_requests_in_flight_are_limited_and_each_one_ending_makes_room() -> None:
    gate, k = KeyGate(), key(in_flight=2)
    gate.admit(k, 0.0, NOON)
    gate.admit(k, 0.0, NOON)
    with pytest.raises(Limited) as e:
        gate.admit(k, 0.0, NOON)
    assert (e.value.what, e.value.limit, e.value.retry_after) == ("in_flight", 2, 1.0)
    gate.leave("alice")
    gate.admit(k, 0.0, NOON)
    gate.admit(ApiKey("bob", limits=KeyLimits(in_flight=1)), 0.0, NOON)  # keys apart


def test_a_stream_is_never_cut_it_spends_and_the_next_request_waits() -> None:
    gate, k = KeyGate(), key(completion_tokens_per_minute=60)  # one token a second
    gate.admit(k, 0.0, NOON)
    for i in range(90):  # a long stream, past the minute's tokens: nothing stops it
        gate.spend(k, "completion", 1, i * 0.01, NOON)
    gate.leave("alice")
    with pytest.raises(Limited) as e:
        gate.admit(k, 1.0, NOON)
    assert e.value.what == "completion_tokens_per_minute" and e.value.limit == 60
    assert e.value.retry_after == pytest.approx(30.0)  # 29 in debt at 1 s, then one token
    assert e.value.tokens["completion"].remaining == 0
    with pytest.raises(Limited):
        gate.admit(k, 30.9, NOON)
    gate.admit(k, 31.1, NOON)  # the window allows it again


def test_prompt_and_completion_tokens_are_counted_apart() -> None:
    gate = KeyGate()
    k = key(prompt_tokens_per_minute=100, completion_tokens_per_minute=1000)
    gate.spend(k, "completion", 500, 0.0, NOON)
    gate.admit(k, 0.0, NOON)  # the prompt's bucket is full
    gate.spend(k, "prompt", 150, 0.0, NOON)
    with pytest.raises(Limited) as e:
        gate.admit(k, 0.0, NOON)
    assert e.value.what == "prompt_tokens_per_minute"
    windows = e.value.tokens
    assert windows["prompt"].remaining == 0 and windows["completion"].remaining == 500
    assert windows["completion"].reset_after == pytest.approx(30.0)


def test_a_quota_is_used_up_then_resets_with_the_utc_day() -> None:
    gate, k = KeyGate(), key(tokens_per_day=100)
    gate.admit(k, 0.0, NOON)
    gate.spend(k, "prompt", 40, 0.0, NOON)
    gate.spend(k, "completion", 70, 0.0, NOON)  # past it: the request under way finishes
    gate.leave("alice")
    with pytest.raises(Limited) as e:
        gate.admit(k, 0.0, NOON + 3600)
    assert e.value.what == "tokens_per_day" and e.value.used == 110
    assert e.value.resets_at == at("2025-07-01T00:00:00")
    assert e.value.retry_after == pytest.approx(11 * 3600)
    with pytest.raises(Limited):
        gate.admit(k, 0.0, at("2025-06-30T23:59:59"))
    gate.admit(k, 0.0, at("2025-07-01T00:00:00"))  # a new day


def test_a_monthly_quota_outlasts_the_day() -> None:
    gate, k = KeyGate(), key(tokens_per_day=1000, tokens_per_month=150)
    gate.spend(k, "prompt", 150, 0.0, at("2025-06-02T10:00:00"))
    with pytest.raises(Limited) as e:
        gate.admit(k, 0.0, at("2025-06-20T10:00:00"))
    assert e.value.what == "tokens_per_month"
    assert e.value.resets_at == at("2025-07-01T00:00:00")
    gate.admit(k, 0.0, at("2025-07-01T00:00:01"))


def test_the_status_page_sees_the_busiest_keys_first() -> None:
    gate = KeyGate()
    gate.admit(ApiKey("a"), 0.0, NOON)
    gate.spend(ApiKey("b"), "prompt", 500, 0.0, NOON)
    gate.spend(ApiKey("c"), "prompt", 50, 0.0, NOON)
    gate.admit(ApiKey("quiet"), 0.0, NOON)
    gate.leave("quiet")
    assert [(x.key, x.in_flight, x.recent_tokens) for x in gate.load(1.0)] == [
        ("a", 1, 0), ("b", 0, 500), ("c", 0, 50)]
    assert gate.load(1000.0) == [gate.load(1000.0)[0]]  # only what is in flight is left


def test_recent_tokens_leave_the_window_slot_by_slot() -> None:
    r = Recent()
    r.add(5, 0.0)
    r.add(7, 150.0)
    assert r.total(299.0) == 12
    assert r.total(305.0) == 7  # the first slot is past the 300 s span
    assert r.total(1000.0) == 0


# ---- the answers -----------------------------------------------------------------------------
def test_a_per_minute_refusal_carries_openai_and_anthropic_headers() -> None:
    gate, k = KeyGate(), key(prompt_tokens_per_minute=120, completion_tokens_per_minute=60)
    gate.spend(k, "prompt", 150, 0.0, NOON)
    with pytest.raises(Limited) as e:
        gate.admit(k, 0.0, NOON)
    err = limited(e.value, NOON)
    assert err.status == 429 and err.type == "tokens" and err.code == "rate_limit_exceeded"
    h = err.headers
    assert h["Retry-After"] == "16"  # 31 tokens at 2 a second
    assert (h["x-ratelimit-limit-tokens"], h["x-ratelimit-remaining-tokens"]) == ("120", "0")
    assert h["x-ratelimit-reset-tokens"] == "1m15s"
    assert h["anthropic-ratelimit-input-tokens-limit"] == "120"
    assert h["anthropic-ratelimit-output-tokens-remaining"] == "60"
    assert h["anthropic-ratelimit-output-tokens-reset"] == iso(NOON)  # full now
    assert "x-should-retry" not in h  # the clients' own retries, after Retry-After, are right
    assert "prompt tokens per minute" in err.message and "alice" in err.message
    assert error_status(err) == 429 and error_body(err)["error"]["type"] == "rate_limit_error"


def test_a_quota_refusal_names_it_and_its_reset_and_stops_the_clients_retrying() -> None:
    gate, k = KeyGate(), key(tokens_per_month=10)
    gate.spend(k, "completion", 10, 0.0, NOON)
    with pytest.raises(Limited) as e:
        gate.admit(k, 0.0, NOON)
    err = limited(e.value, NOON)
    assert (err.status, err.type, err.code) == (429, "insufficient_quota", "insufficient_quota")
    assert "10 tokens per month" in err.message and "2025-07-01T00:00:00Z" in err.message
    assert err.headers["x-should-retry"] == "false"
    assert err.headers["x-exod-quota-reset"] == "2025-07-01T00:00:00Z"
    assert err.headers["Retry-After"] == str(12 * 3600)
    assert error_status(err) == 529  # Anthropic's Messages: overloaded, not to be retried
    assert error_body(err)["error"]["type"] == "overloaded_error"


def test_in_flight_refusal() -> None:
    err = limited(Limited("alice", "in_flight", 3, 1.0), NOON)
    assert (err.status, err.type, err.headers["Retry-After"]) == (429, "requests", "1")
    assert "3 request(s) in flight" in err.message


@pytest.mark.parametrize(("seconds", "text"), [
    (0.25, "250ms"), (1.0, "1s"), (59.2, "1m0s"), (360, "6m0s"), (3723, "1h2m3s")])
def test_resets_are_written_as_openai_writes_them(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text
