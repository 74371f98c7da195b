"""Model files from cluster peers, for real: exods in network namespaces on one Linux bridge, and
no hub anywhere (HF_ENDPOINT names a port nothing listens on).

Node 1 holds a hub model in its cache; node 2's instance names it, gets its files from node 1
over a slowed link, is stopped half way and started again (the rest is asked for from where
its partial file ends), then serves the same greedy tokens as mlx-lm. A stranger's machine
asks node 1 for files with another key, and with the key for a path outside the model: both
refused, each one row of `exoctl cluster`. Then two peers each serve one file with a flipped
byte: whichever is asked first for it, the hash catches it, and the other one is asked.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exod.wire.announce import cluster_id, new_nonce
from exod.wire.peer_files import FileAsk, sign_ask
from tests.harness import REPO, Daemon
from tests.integration.test_cluster_discovery import GIB, PORT, key_file, members, node_config, \
    until
from tests.netns import Bridge, Host, NetnsUnavailable, ip
from tests.peer_cache import COMMIT, fill_from, flip

NO_HUB = {"HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens there: no hub at all
COOPERATIVE = {"EXOD_DOUBLE": "cooperative"}  # a runner that loads nothing: the files are tested
EOS = "2"


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    try:
        b = Bridge(4).__enter__()
    except NetnsUnavailable as e:
        pytest.fail(str(e))  # CI runs as root: this must work there
    try:
        yield b
    finally:
        b.close()


def node(daemons: Callable[..., Daemon], host: Host, key: Path, cache: Path,
         instances: dict[str, Any] | None = None) -> Daemon:
    config = node_config(host, key, 4 * GIB)
    config.update({"api": {"listen": "127.0.0.1:0"}, "hub": {"cache": str(cache)},
                   "defaults": {"stop": {"grace": "10s"}}, "instances": instances or {}})
    return daemons(config, name=host.name, env=NO_HUB)


def holds(d: Daemon, node_id: str) -> None:
    until(d, lambda c: any(m["name"] == "org/tiny" for m in
                           members(c).get(node_id, {}).get("info", {}).get("models", [])),
          f"{node_id} to announce org/tiny")


def send_from(host: Host, to: Host, obj: dict[str, Any]) -> dict[str, Any]:
    """One line sent to `to`'s cluster endpoint from `host`'s namespace; the answer's line."""
    res = subprocess.run([*host.prefix(), sys.executable, "-m", "tests.cluster_stranger", "send",
                          to.address, str(PORT)], input=json.dumps(obj).encode() + b"\n",
                         capture_output=True, timeout=60, cwd=REPO, check=True)
    return dict(json.loads(res.stdout))


def complete(host: Host, d: Daemon, prompt: str) -> str:
    """A greedy completion asked of `d`'s API from inside its host (its API is on loopback)."""
    body = {"model": "a", "prompt": prompt, "max_tokens": 12, "temperature": 0,
            "logit_bias": {EOS: -100}}
    code = ("import json, sys, urllib.request as u\n"
            "r = u.urlopen(u.Request(sys.argv[1], data=sys.argv[2].encode(), "
            "headers={'Content-Type': 'application/json'}), timeout=120)\n"
            "print(json.load(r)['choices'][0]['text'])")
    res = subprocess.run([*host.prefix(), sys.executable, "-c", code,
                          d.api_url() + "/v1/completions", json.dumps(body)],
                         capture_output=True, text=True, timeout=180, check=True)
    return res.stdout[:-1]


REFERENCE = """
import json, sys
import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_logits_processors
model, tok = load(sys.argv[1])
print(json.dumps("".join(r.text for r in stream_generate(
    model, tok, sys.argv[2], max_tokens=12, sampler=lambda x: mx.argmax(x, -1),
    logits_processors=make_logits_processors({EOS: -100.0})))))
""".replace("EOS", str(int(EOS)))


def reference(model: Path, prompt: str) -> str:
    """What in-process mlx-lm generates: greedy, the end token banned (in a process of its
    own: the test's never imports mlx)."""
    out = subprocess.run([sys.executable, "-c", REFERENCE, str(model), prompt],
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    text: str = json.loads(out.strip().splitlines()[-1])
    return text


def slow(host: Host, rate: str | None) -> None:
    """The host's outgoing traffic limited to `rate` (None: as fast as it goes)."""
    if rate is None:
        ip("netns", "exec", host.netns, "tc", "qdisc", "del", "dev", host.veth, "root")
        return
    ip("netns", "exec", host.netns, "tc", "qdisc", "add", "dev", host.veth, "root", "tbf",
       "rate", rate, "burst", "16kb", "latency", "400ms")


def test_a_node_without_the_model_gets_it_from_a_peer_resumes_and_serves(
        daemons: Callable[..., Daemon], bridge: Bridge, tiny_model: Path,
        tmp_path: Path) -> None:
    key = key_file(tmp_path / "cluster.key", "0123456789abcdef" * 4)
    h1, h2, _, h4 = bridge.hosts
    snap = fill_from(tmp_path / "cache-1", "org/tiny", tiny_model)
    one = node(daemons, h1, key, tmp_path / "cache-1")
    two = node(daemons, h2, key, tmp_path / "cache-2", {"a": {"model": "hf:org/tiny",
                                                              "autostart": False}})
    one.start(prefix=tuple(h1.prefix()))
    two.start(prefix=tuple(h2.prefix()))
    holds(two, one.status()["cluster"]["announced"]["node_id"])

    slow(h1, "2mbit")
    two.ctl("start", "a")
    inst = two.until_instance("a", lambda i: (i["download"] or {}).get("done_bytes", 0)
                              > 1_000_000, what="a million bytes from node 1")
    assert inst["download"]["source"] == "node-1", inst["download"]
    assert inst["detail"].startswith("downloading") and "from node-1" in inst["detail"], inst
    two.ctl("stop", "a")
    assert two.instance("a")["state"] == "stopped"
    blobs = tmp_path / "cache-2" / "models--org--tiny" / "blobs"
    (part,) = blobs.glob("*.incomplete")
    kept = part.stat().st_size
    weights = (snap / "model.safetensors").stat().st_size
    assert 0 < kept < weights

    slow(h1, None)
    two.ctl("start", "a")
    ready = two.until_state("a", "ready")
    assert ready["model"].endswith(f"snapshots/{COMMIT}")
    got = Path(ready["model"])
    for f in snap.iterdir():
        assert (got / f.name).read_bytes() == f.read_bytes(), f.name
    # Resumed where the partial file ended: no byte of it was asked for again.
    sent = [line for line in one.log_text().splitlines() if "sent model.safetensors" in line]
    assert any(f"from offset {kept}:" in line and f"{weights - kept} byte(s)" in line
               for line in sent), sent
    assert "hub" not in (two.instance("a")["download"] or {}).get("error", "")
    prompt = "The quick brown"
    assert complete(h2, two, prompt) == reference(tiny_model, prompt)

    # A machine with another key, and one with the key asking for a path outside the model.
    other = b"fedcba9876543210" * 4
    stranger = FileAsk(cluster_id(other), "x", time.time(), new_nonce(), "org/tiny", "main",
                       "config.json")
    assert "another cluster" in send_from(h4, h1, {"file": sign_ask(stranger, other)})["refused"]
    secret = key.read_bytes().strip()
    for path in ("../../../../../etc/passwd", f"exod/{COMMIT}.json"):
        outside = FileAsk(cluster_id(secret), "x", time.time(), new_nonce(), "org/tiny", "main",
                          path)
        refused = send_from(h4, h1, {"file": sign_ask(outside, secret)})["refused"]
        assert "is not a file of" in refused, refused
    table = one.ctl("cluster").stdout
    assert "a file request of another cluster's key" in table and "is not a file of" in table
    log = one.log_text()
    assert "a file request of another cluster's key" in log and "is not a file of" in log


def test_a_flipped_byte_from_a_peer_is_caught_and_another_peer_asked(
        daemons: Callable[..., Daemon], bridge: Bridge, tiny_model: Path,
        tmp_path: Path) -> None:
    key = key_file(tmp_path / "cluster.key", "0123456789abcdef" * 4)
    h1, h2, h3, _ = bridge.hosts
    # Each holder has one bad file: whichever is asked first for either, one hash is wrong.
    flip(fill_from(tmp_path / "cache-1", "org/tiny", tiny_model), "model.safetensors")
    snap = fill_from(tmp_path / "cache-3", "org/tiny", tiny_model)
    flip(snap, "tokenizer.json")
    holders = [node(daemons, h, key, tmp_path / f"cache-{i}") for i, h in ((1, h1), (3, h3))]
    two = node(daemons, h2, key, tmp_path / "cache-2", {"a": {
        "model": "hf:org/tiny", "autostart": False, "env": COOPERATIVE}})
    for d, h in zip([*holders, two], (h1, h3, h2), strict=True):
        d.start(prefix=tuple(h.prefix()))
    for d in holders:
        holds(two, d.status()["cluster"]["announced"]["node_id"])

    two.ctl("start", "a")
    got = Path(two.until_state("a", "ready")["model"])
    for f in tiny_model.iterdir():
        if (got / f.name).exists():
            assert hashlib.sha256((got / f.name).read_bytes()).digest() == \
                hashlib.sha256(f.read_bytes()).digest(), f.name
    assert (got / "model.safetensors").exists() and (got / "tokenizer.json").exists()
    caught = [line for line in two.log_text().splitlines()
              if "does not match the hub's hash: trying another peer" in line]
    assert len(caught) == 1, caught
    assert "model.safetensors from node-1" in caught[0] or \
        "tokenizer.json from node-3" in caught[0], caught
