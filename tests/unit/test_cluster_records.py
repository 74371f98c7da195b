"""Signed announcements (exod.wire.announce) and the replay guard (exod.core.replay)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exod.core.nodes import Link, NodeInfo, NodeModel
from exod.core.replay import ReplayGuard
from exod.wire.announce import Record, Refused, cluster_id, new_nonce, open_record, seal

KEY = b"k" * 32
INFO = NodeInfo("n1", "mac-studio", "metal", 192 * 2**30, 180 * 2**30, 2**40,
                (NodeModel("mlx-community/Qwen3-8B-4bit", "a" * 40), NodeModel("local")),
                ("10.0.0.2", "fd00::2"), 52415, 52416)


def record(**kw: object) -> Record:
    base = dict(cluster=cluster_id(KEY), node=INFO, time=1000.5, nonce=new_nonce(),
                links=(Link("n1", "n2", 0.01),))
    return Record(**{**base, **kw})  # type: ignore[arg-type]


def refusal(signed: object, key: bytes = KEY) -> Refused:
    with pytest.raises(Refused) as info:
        open_record(signed, key)
    return info.value


def test_a_sealed_record_opens_to_itself() -> None:
    r = record(reply_to="abc")
    assert open_record(seal(r, KEY), KEY) == r


def test_the_cluster_id_names_the_key_without_holding_it() -> None:
    assert cluster_id(KEY) == cluster_id(KEY) != cluster_id(b"j" * 32)
    signed = seal(record(), KEY)
    assert KEY.decode() not in str(signed)


@pytest.mark.parametrize("path, value", [
    (("node", "memory_total"), 2**50),
    (("node", "models"), []),
    (("node", "addresses"), ["10.6.6.6"]),
    (("time",), 1001.5),
    (("nonce",), "0" * 32),
    (("reply_to",), "x"),
    (("links",), []),
])
def test_every_field_is_covered_by_the_mac(path: tuple[str, ...], value: object) -> None:
    signed = seal(record(), KEY)
    changed = copy.deepcopy(signed)
    target = changed["record"]
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    r = refusal(changed)
    assert r.kind == "bad-mac" and r.claimed == "n1"


def test_refusals_say_what_is_wrong() -> None:
    other = seal(record(cluster=cluster_id(b"j" * 32)), b"j" * 32)  # another cluster's node
    assert refusal(other).kind == "other-cluster"
    forged = seal(record(), b"j" * 32)
    forged["record"]["cluster"] = cluster_id(KEY)  # our id, but not our key
    assert refusal(forged).kind == "bad-mac"
    unsigned = seal(record(), KEY)
    del unsigned["mac"]
    assert refusal(unsigned).kind == "unsigned"
    assert refusal({"hello": 1}).kind == "not-exod"
    assert refusal([1, 2]).kind == "not-exod"
    # Signed with the key, but not a record: refused as malformed, never raised otherwise.
    odd = seal(record(), KEY)
    odd["record"]["node"]["memory_total"] = "lots"
    from exod.wire.announce import mac
    odd["mac"] = mac(KEY, odd["record"])
    assert refusal(odd).kind == "malformed"


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c,
                                                                       max_size=3),
                    max_leaves=20))
def test_anything_at_all_is_refused_cleanly(value: object) -> None:
    for signed in (value, {"record": value, "mac": "00"}, {"record": value}):
        try:
            open_record(signed, KEY)
        except Refused:
            pass


def test_the_replay_guard_refuses_a_nonce_twice_and_old_records() -> None:
    g = ReplayGuard(window=30)
    assert g.check(1000.0, "a", now=1000.0) is None
    assert g.check(1000.0, "a", now=1001.0) == ("replayed",
                                                "replayed: its nonce was seen before")
    assert g.check(1001.0, "b", now=1001.0) is None
    assert g.check(960.0, "c", now=1000.0)[0] == "clock"  # type: ignore[index]
    assert g.check(1040.0, "d", now=1000.0)[0] == "clock"  # type: ignore[index]
    # Past the window a nonce is forgotten, and the time alone refuses its record.
    later = g.check(1000.0, "a", now=1031.0)
    assert later is not None and later[0] == "clock"
    assert len(g) == 1  # "b" is still within its window
