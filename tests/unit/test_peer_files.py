"""Model files between cluster peers: the signed ask and manifest, which names may be asked for,
which files a layer range needs, which peers are asked first, and a real endpoint on loopback
serving a cache folder to the fetcher's client (exod.hub.from_peers)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exod.core.file_peers import PeerSource, choose
from exod.core.hub_ref import make
from exod.core.nodes import Link, NodeInfo, NodeModel
from exod.daemon.cluster.endpoint import Endpoint
from exod.daemon.cluster.file_server import FileServer
from exod.hub import cache as hc
from exod.hub import from_peers
from exod.hub.fetch import FetchJob
from exod.hub.files import layer_files, servable
from exod.wire.announce import Refused, cluster_id, new_nonce
from exod.wire.peer_files import FileAsk, open_ask, open_manifest, sign_ask, sign_manifest
from tests.peer_cache import COMMIT, fill, flip

KEY = b"k" * 32
OTHER = b"o" * 32


def an_ask(key: bytes = KEY, **kw: Any) -> FileAsk:
    base: dict[str, Any] = dict(cluster=cluster_id(key), node="n", time=time.time(),
                                nonce=new_nonce(), repo="org/tiny", revision="main")
    return FileAsk(**{**base, **kw})


def test_an_ask_opens_only_with_the_key_and_unaltered() -> None:
    ask = an_ask(path="model.safetensors", offset=5)
    assert open_ask(sign_ask(ask, KEY), KEY) == ask
    with pytest.raises(Refused) as e:
        open_ask(sign_ask(an_ask(OTHER), OTHER), KEY)
    assert e.value.kind == "other-cluster"
    forged = sign_ask(ask, KEY)
    forged["ask"]["path"] = "../../etc/passwd"
    with pytest.raises(Refused) as e:
        open_ask(forged, KEY)
    assert e.value.kind == "bad-mac"
    with pytest.raises(Refused) as e:
        open_ask({"ask": forged["ask"]}, KEY)
    assert e.value.kind == "unsigned"
    bad = sign_ask(ask, KEY)
    bad["ask"]["offset"] = -1
    bad["mac"] = sign_ask(an_ask(), KEY)["mac"]
    with pytest.raises(Refused):
        open_ask(bad, KEY)


def test_a_manifest_answers_only_its_own_ask() -> None:
    signed = sign_manifest({"commit": COMMIT, "files": {}}, "nonce-1", KEY)
    assert open_manifest(signed, "nonce-1", KEY)["commit"] == COMMIT
    with pytest.raises(ValueError):
        open_manifest(signed, "nonce-2", KEY)  # an answer to another ask, sent again
    with pytest.raises(ValueError):
        open_manifest({**signed, "manifest": {"commit": "x", "files": {}}}, "nonce-1", KEY)
    with pytest.raises(ValueError):
        open_manifest(signed, "nonce-1", OTHER)


@pytest.mark.parametrize(("name", "ok"), [
    ("model.safetensors", True), ("config.json", True), ("tokenizer.model", True),
    ("../config.json", False), ("sub/model.safetensors", False), ("/etc/passwd", False),
    ("..", False), ("modeling.py", False), ("a\\..\\b.json", False), ("x\0.json", False)])
def test_only_top_level_model_files_may_be_asked_for(name: str, ok: bool) -> None:
    assert servable(name) is ok


def test_the_files_a_layer_range_needs() -> None:
    weight_map = {
        "model.embed_tokens.weight": "model-00001-of-00003.safetensors",
        "model.layers.0.mlp.up_proj.weight": "model-00001-of-00003.safetensors",
        "model.layers.1.mlp.up_proj.weight": "model-00001-of-00003.safetensors",
        "model.layers.1.self_attn.q_proj.weight": "model-00002-of-00003.safetensors",
        "model.layers.2.mlp.up_proj.weight": "model-00002-of-00003.safetensors",
        "model.layers.3.mlp.up_proj.weight": "model-00003-of-00003.safetensors",
        "model.norm.weight": "model-00003-of-00003.safetensors",
    }
    assert layer_files(weight_map, 2, 3) == {"model-00001-of-00003.safetensors",
                                             "model-00002-of-00003.safetensors",
                                             "model-00003-of-00003.safetensors"}
    only = {k: v for k, v in weight_map.items() if "layers" in k}
    assert layer_files(only, 2, 4) == {"model-00002-of-00003.safetensors",
                                       "model-00003-of-00003.safetensors"}
    assert layer_files(only, 0, 1) == {"model-00001-of-00003.safetensors"}
    assert layer_files(only, 4, 9) == set()


def node(ident: str, *models: NodeModel, address: str = "10.0.0.1") -> NodeInfo:
    return NodeInfo(ident, f"name-{ident}", "cpu", 1, 1, 1, models, (address,) if address else (),
                    0, 52416)


def test_peers_holding_the_commit_are_asked_fastest_link_first() -> None:
    m1, m2 = NodeModel("org/tiny", COMMIT), NodeModel("org/tiny", "f" * 40)
    members = [node("me", m1), node("a", m1), node("b", m1), node("c", m2), node("d", m1),
               node("e", NodeModel("org/other", COMMIT)), node("f", m1, address="")]
    links = [Link("me", "a", 0.5), Link("b", "me", 0.1), Link("a", "b", 0.001)]
    order = [s.node_id for s in choose(members, links, "me", "org/tiny", COMMIT)]
    assert order == ["b", "a", "d"]  # measured, fastest first; then unmeasured; never self
    assert [s.node_id for s in choose(members, links, "me", "org/tiny", None)] == \
        ["b", "a", "c", "d"]  # a branch: whoever holds the repository resolves it
    assert choose(members, links, "me", "org/none", None) == []
    assert choose(members, [], "me", "org/tiny", COMMIT)[0] == PeerSource("a", "name-a", "10.0.0.1",
                                                                      52416)


# ---- a real endpoint on loopback ------------------------------------------------------------
class Served:
    def __init__(self, cache: Path, key: bytes = KEY) -> None:
        self.refusals: list[tuple[str, str]] = []
        self.loop = asyncio.new_event_loop()
        self.files = FileServer(key, cache, 30.0,
                                lambda a, kind, why, c: self.refusals.append((kind, why)))
        self.endpoint = Endpoint("127.0.0.1", 0, self._no_hello, self.files.serve)
        self.port = self.loop.run_until_complete(self.endpoint.start())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def _no_hello(signed: Any, address: str) -> dict[str, Any]:
        raise Refused("not-exod", "no hellos here")

    def source(self, name: str = "peer") -> PeerSource:
        return PeerSource(name, name, "127.0.0.1", self.port)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.endpoint.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Link_:
    """The fetcher's channel, as the client sees it: what it was told, kept."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, msg: Any) -> None:
        self.sent.append(msg)


DATA = {"model.safetensors": os.urandom(3 << 20), "config.json": b'{"a": 1}\n',
        "tokenizer.json": b'{"t": 2}\n'}


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[tuple[Served, Path]]:
    snap = fill(tmp_path / "a", "org/tiny", DATA)
    served = Served(tmp_path / "a")
    try:
        yield served, snap
    finally:
        served.close()


def job(cache: Path, *peers: PeerSource, key: bytes = KEY) -> FetchJob:
    return FetchJob(make("org/tiny", "main"), cache, False, False, None,
                    Link_(), tuple(peers), key)  # type: ignore[arg-type]


def raw(port: int, obj: dict[str, Any]) -> dict[str, Any]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(json.dumps({"file": obj}).encode() + b"\n")
        return dict(json.loads(s.makefile("rb").readline()))


def test_a_peer_fills_a_cache_resumes_and_counts_its_bytes(
        peer: tuple[Served, Path], tmp_path: Path) -> None:
    served, _ = peer
    cache = tmp_path / "b"
    ref = make("org/tiny", "main")
    # A partial file as a stopped fetch leaves it: only the rest is asked for.
    rec = from_peers.manifest_of(job(cache, served.source()), served.source()).files[
        "model.safetensors"]
    blobs = hc.repo_dir(cache, ref) / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{rec.blob}.incomplete").write_bytes(DATA["model.safetensors"][:1 << 20])
    j = job(cache, served.source())
    snap = from_peers.run(j)
    assert snap is not None and snap.name == COMMIT
    for name, data in DATA.items():
        assert (snap / name).read_bytes() == data
    assert served.files.served == sum(map(len, DATA.values())) - (1 << 20)
    found = hc.cached(cache, ref)
    assert found is not None and found.checked
    sources = {getattr(m, "source", None) for m in j.link.sent}  # type: ignore[attr-defined]
    assert "peer" in sources


def test_a_flipped_byte_is_caught_and_the_next_peer_asked(
        peer: tuple[Served, Path], tmp_path: Path) -> None:
    served, snap = peer
    flip(snap, "model.safetensors")
    fill(tmp_path / "c", "org/tiny", DATA)
    good = Served(tmp_path / "c")
    try:
        j = job(tmp_path / "b", served.source("bad"), good.source("good"))
        out = from_peers.run(j)
        assert out is not None
        assert hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest() == \
            hashlib.sha256(DATA["model.safetensors"]).hexdigest()
        said = [getattr(m, "text", "") for m in j.link.sent]  # type: ignore[attr-defined]
        assert any("model.safetensors from bad does not match the hub's hash" in t
                   for t in said), said
    finally:
        good.close()


def test_no_peer_that_can_serve_leaves_it_to_the_hub(
        peer: tuple[Served, Path], tmp_path: Path) -> None:
    served, snap = peer
    flip(snap, "config.json")
    assert from_peers.run(job(tmp_path / "b", served.source())) is None
    closed = PeerSource("gone", "gone", "127.0.0.1", 1)
    assert from_peers.run(job(tmp_path / "b", closed)) is None


def test_refusals(peer: tuple[Served, Path], tmp_path: Path) -> None:
    served, snap = peer
    port = served.port
    # Another key: a node that is not a member.
    assert "another cluster" in raw(port, sign_ask(an_ask(OTHER), OTHER))["refused"]
    # A path outside the model, signed with the key all the same.
    for path in ("../../../../etc/passwd", "/etc/passwd", "exod/" + COMMIT + ".json",
                 "modeling.py"):
        answer = raw(port, sign_ask(an_ask(path=path), KEY))
        assert "is not a file of" in answer["refused"], (path, answer)
    # A model it does not hold, and one named strangely.
    assert "not whole" in raw(port, sign_ask(an_ask(repo="org/none"), KEY))["refused"]
    assert "not a hub model" in raw(port, sign_ask(an_ask(repo="../x"), KEY))["refused"]
    # The same ask twice: a replay.
    once = sign_ask(an_ask(path="config.json"), KEY)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(json.dumps({"file": once}).encode() + b"\n")
        assert "file" in json.loads(s.makefile("rb").readline())
    assert "replayed" in raw(port, once)["refused"]
    # A snapshot link that leads out of the cache is never followed.
    (snap / "config.json").unlink()
    outside = tmp_path / "secret.json"
    outside.write_bytes(DATA["config.json"])
    os.symlink(outside, snap / "config.json")
    answer = raw(port, sign_ask(an_ask(path="config.json"), KEY))
    assert "leads out of" in answer["refused"]
    kinds = {k for k, _ in served.refusals}
    assert {"other-cluster", "bad-path", "missing", "replayed"} <= kinds
