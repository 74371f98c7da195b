"""The control socket's messages (exoctl ↔ the daemon): every request, answer and event
survives the wire as the same typed value, and anything malformed is refused by name."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exod.wire import control as cm
from exod.wire import control_status as cs
from exod.daemon.control import parse_request
from exod.wire.protocol import ProtocolError, to_wire

RANK = cs.RankStatus(
    rank=1, host="10.0.0.2", remote=True, pid=None, state="ready", layers=[2, 4],
    layers_loaded=2, layers_total=2, rss_bytes=5 << 20, uptime_s=3.5,
    last_exit=cs.ExitStatus(76, None, "exit code 76"), status="ready", phase="ready",
    error=None, no_progress_s=None, heartbeat_age_s=1.2,
    ladder=cs.LadderStatus("SIGTERM", 13.0))
INSTANCE = cs.InstanceStatus(
    name="big", state="ready", detail="ready", reason=None, since_s=10.0, uptime_s=10.0,
    model="/models/big", shards=2, parallelism="tensor", autostart="on-demand",
    restart="always", restarts=0, source="", ranks=[RANK, RANK],
    serving=cs.ServingStatus("continuous", 8, 1, 256, cs.PromptCacheStatus(
        entries=1, bytes=10, max_bytes=100, lookups=2, hits=1, hit_rate=0.5, cached_tokens=3,
        prompt_tokens=6, disk=cs.DiskCacheStatus(
            state="ready", entries=3, bytes=300, max_bytes=1000, hits=1, hit_rate=0.5,
            cached_tokens=2, load_s=0.25, writes=3, errors=0))))
DAEMON = cs.DaemonStatus(
    pid=1, version="0.1.0", uptime_s=2.0, state="running", config="/etc/exod.yaml",
    control_socket="/run/exod/control.sock", summary="1/1 ready",
    api=cs.ApiStatus(["127.0.0.1:8000"], "http://127.0.0.1:8000", ["http://127.0.0.1:8000"], True,
                     None),
    stop_worst_case_s=40.0)

REQUESTS: list[cm.Request] = [
    cm.GetStatus(), cm.Start("big"), cm.Stop("big"), cm.RestartRequest("big"), cm.Reload(),
    cm.Wait("big"), cm.Watch(), cm.Logs("big"), cm.Logs("big", lines=0, rank=1, follow=True),
    cm.Pull("hf:org/tiny@v1"), cm.Models(), cm.RemoveModel("hf:org/tiny"), cm.ClearCacheRequest(),
    cm.ClearCacheRequest("big")]
ANSWERS: list[tuple[cm.Request, Any]] = [
    (cm.GetStatus(), cm.StatusReply(DAEMON, [INSTANCE])),
    (cm.Start("big"), cm.StateReply("starting")),
    (cm.Reload(), cm.ReloadReply(["a"], [], ["b"], ["c"])),
    (cm.Wait("big"), cm.WaitReply(INSTANCE)),
    (cm.Wait("big"), cm.ProgressEvent(INSTANCE)),
    (cm.Wait("big"), cm.Failure("big is failed: exit code 65", instance=INSTANCE)),
    (cm.Reload(), cm.Failure("invalid configuration", ["a.yaml:3:1: x: bad"])),
    (cm.Watch(), cm.SnapshotEvent(DAEMON, [])),
    (cm.Logs("big"), cm.LineEvent(1.5, "big", 0, 42, "WARNING", "héllo")),
    (cm.Logs("big"), cm.DoneReply()),
    (cm.Pull("hf:org/tiny"), cm.DownloadEvent("downloading 1.2 of 4.5 GB (27%, 38 MB/s)")),
    (cm.Pull("hf:org/tiny"), cm.PullReply("/c/models--org--tiny/snapshots/abc", "abc")),
    (cm.Models(), cm.ModelsReply("/c", [cm.CachedModel(
        "org/tiny", {"main": "abc"}, ["abc"], 3_500_000, 0,
        [cm.ModelUser("a", "ready", "main")])])),
    (cm.RemoveModel("hf:org/tiny"), cm.RemovedReply("org/tiny")),
    (cm.ClearCacheRequest(), cm.ClearedReply([cm.ClearedCache("big", "runner", 0),
                                       cm.ClearedCache("off", "files", 1234)])),
]


def over_the_line(obj: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(obj).encode() + b"\n")
    return out


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: type(r).__name__)
def test_every_request_round_trips(req: cm.Request) -> None:
    line = json.dumps(to_wire(req, cm.REQUEST_TAG)).encode()
    assert parse_request(line) == req


def test_a_request_is_what_exoctl_1_documents() -> None:
    assert to_wire(cm.Stop("big"), cm.REQUEST_TAG) == {"cmd": "stop", "name": "big"}
    assert parse_request(b'{"cmd": "logs", "name": "x"}') == cm.Logs("x", 20, None, False)


@pytest.mark.parametrize("req, answer", ANSWERS, ids=range(len(ANSWERS)))
def test_every_answer_and_event_round_trips(req: cm.Request, answer: Any) -> None:
    tag = cm.EVENT_TAG if isinstance(answer, cm.EVENT_TYPES) else "type"
    assert cm.decode_line(over_the_line(to_wire(answer, tag)), req) == answer


def test_answers_say_ok_and_events_say_what_they_are() -> None:
    assert to_wire(cm.StateReply("ready")) == {"state": "ready", "ok": True}
    assert to_wire(cm.Failure("no")) == {"error": "no", "problems": [], "instance": None,
                                         "ok": False}
    assert to_wire(cm.LineEvent(1.0, "a", 0, 1, "INFO", "x"), cm.EVENT_TAG)["event"] == "line"


@pytest.mark.parametrize("line, fragment", [
    (b"[1]", "a JSON object with a string 'cmd'"),
    (b"{", "Expecting property name"),
    (b"\xff", "codec can't decode"),
    (b'{"cmd": 5}', "a JSON object with a string 'cmd'"),
    (b'{"cmd": "bogus"}', "unknown command 'bogus'"),
    (b'{"cmd": "start"}', "start: missing field 'name'"),
    (b'{"cmd": "start", "name": 5}', "start.name: unexpected value 5"),
    (b'{"cmd": "status", "name": "x"}', "status: unknown field(s) name"),
    (b'{"cmd": "logs", "name": "x", "lines": -1}', "lines must be a whole number >= 0"),
    (b'{"cmd": "logs", "name": "x", "lines": true}', "logs.lines: unexpected value True"),
    (b'{"cmd": "logs", "name": "x", "rank": "1"}', "logs.rank: unexpected value '1'"),
    (b'{"cmd": "logs", "name": "x", "follow": 1}', "logs.follow: unexpected value 1"),
    (b"[" * 100_000, "not JSON"),
])
def test_a_malformed_request_is_refused_by_name(line: bytes, fragment: str) -> None:
    with pytest.raises(ProtocolError) as e:
        parse_request(line)
    assert fragment in str(e.value), str(e.value)


@pytest.mark.parametrize("obj, fragment", [
    ({"ok": True}, "StatusReply: missing field 'daemon'"),
    ({"ok": "yes"}, "must say ok: true or false"),
    ({"ok": False}, "failure: missing field 'error'"),
    ({**to_wire(cm.StatusReply(DAEMON, [])), "extra": 1}, "unknown field(s) extra"),
    ({**to_wire(cm.StatusReply(DAEMON, [])), "instances": [{"name": "x"}]},
     "StatusReply.instances: missing field"),
    ({"event": "nope"}, "unknown message type 'nope'"),
])
def test_a_malformed_answer_is_refused(obj: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ProtocolError) as e:
        cm.decode_line(obj, cm.GetStatus())
    assert fragment in str(e.value), str(e.value)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(cmd=st.sampled_from([*cm.REQUESTS, "x"]) | JSON,
       fields=st.dictionaries(st.sampled_from(["name", "lines", "rank", "follow", "x"]), JSON,
                              max_size=4))
def test_any_line_is_a_request_or_a_protocol_error(cmd: Any, fields: dict[str, Any]) -> None:
    try:
        req = parse_request(json.dumps({"cmd": cmd, **fields}).encode())
    except ProtocolError:
        return
    # What passed is what was sent, field by field: nothing dropped, nothing coerced.
    wire = to_wire(req, cm.REQUEST_TAG)
    assert wire["cmd"] == cmd and all(wire[k] == v for k, v in fields.items())


def test_states_are_state_values_that_travel_as_their_names() -> None:
    import dataclasses

    from exod.core.states import State

    rank = dataclasses.replace(RANK, state=State.STOPPING)
    status = cm.StatusReply(DAEMON, [dataclasses.replace(INSTANCE, state=State.BACKOFF,
                                                         ranks=[rank])])
    obj = over_the_line(to_wire(status))
    assert obj["instances"][0]["state"] == "backoff"  # as exoctl(1) documents the JSON
    assert obj["instances"][0]["ranks"][0]["state"] == "stopping"
    got = cm.decode_line(obj, cm.GetStatus())
    assert isinstance(got, cm.StatusReply)
    assert got.instances[0].state is State.BACKOFF and got.instances[0].ranks[0].state is \
        State.STOPPING
    assert cm.decode_line({"state": "ready", "ok": True}, cm.Start("x")) == \
        cm.StateReply(State.READY)
    odd = {**obj, "instances": [{**obj["instances"][0], "state": "asleep"}]}
    with pytest.raises(ProtocolError, match="state: unexpected value 'asleep'"):
        cm.decode_line(odd, cm.GetStatus())
