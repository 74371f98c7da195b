"""Any node serves, for real: two network namespaces joined by a veth pair, one exod in each,
one 2-rank pipeline across them, rank 0 on host-a. Every request is sent from host-b's
namespace (tests.netns_client) to host-b's API, which runs no rank 0: it is sent on to host-a's
and its answer relayed, streamed as it comes, cancelled when the client leaves, under the
client's own key. Then host-a's API goes away: host-b answers 503 naming it, at once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exod.core.keys import hash_text
from tests.harness import REPO, SAFETY, Daemon
from tests.netns import Host, NetnsUnavailable, TwoHosts

PORT = 52415  # each API on its own host's address (each namespace has its own ports)
EOS = "2"  # the tiny model's end token: banned, every answer is max_tokens long
SHARED, ONLY_B = "shared-secret", "b-only-secret"
PROMPT = [{"role": "user", "content": "def fibonacci(n):"}]


class Client:
    """tests.netns_client, run in a host's namespace."""

    def __init__(self, host: Host) -> None:
        self.proc = subprocess.Popen([*host.prefix(), sys.executable, "-m", "tests.netns_client"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=REPO)

    def send(self, obj: dict[str, Any] | str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the client in the namespace died (its stderr is in the test's output)"
        return dict(json.loads(line))

    def post(self, url: str, body: dict[str, Any], key: str = SHARED) -> dict[str, Any]:
        return self.send({"op": "post", "url": url, "body": body,
                          "headers": {"Authorization": f"Bearer {key}"}})

    def get(self, url: str, key: str = SHARED) -> dict[str, Any]:
        return self.send({"op": "get", "url": url, "headers": {"Authorization": f"Bearer {key}"}})

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def config(hosts: TwoHosts, me: Host, model: Path, key: Path, keys: list[str]
           ) -> dict[str, Any]:
    return {"node": {"name": me.name},
            "api": {"listen": f"{me.address}:{PORT}",
                    "keys": [{"name": k.split("-")[0], "hash": hash_text(k)} for k in keys]},
            "instances": {"pp": {
                "model": str(model), "shards": 2, "port_base": 6320, "peer_timeout": "5s",
                "cluster_key_file": str(key), "max_concurrency": 1,
                "hosts": [{"name": hosts.a.name, "address": hosts.a.address},
                          {"name": hosts.b.name, "address": hosts.b.address}]}}}


@pytest.fixture
def pair(daemons: Callable[..., Daemon], tiny_model: Path, tmp_path: Path
         ) -> Iterator[tuple[TwoHosts, Daemon, Daemon, Client]]:
    key = tmp_path / "cluster.key"
    key.write_text("0123456789abcdef" * 4)
    key.chmod(0o600)
    try:
        hosts = TwoHosts().__enter__()
    except NetnsUnavailable as e:
        pytest.fail(str(e))  # CI runs as root: this must work there
    client = None
    try:
        a = daemons(config(hosts, hosts.a, tiny_model, key, [SHARED]), name="host-a")
        b = daemons(config(hosts, hosts.b, tiny_model, key, [SHARED, ONLY_B]), name="host-b")
        a.start(prefix=tuple(hosts.a.prefix()))
        b.start(prefix=tuple(hosts.b.prefix()))
        for d in (a, b):
            d.until_state("pp", "ready")
        client = Client(hosts.b)
        yield hosts, a, b, client
    finally:
        if client is not None:
            client.close()
        for d in (locals().get("a"), locals().get("b")):
            if d is not None:
                d.close()
        hosts.close()


def announcing(d: Daemon, instance: str) -> None:
    """Poll `d`'s cluster status until a member announces `instance` (a bound against hangs
    only): a member joining changes no instance, so the watch stream says nothing of it."""
    deadline = time.monotonic() + SAFETY
    while time.monotonic() < deadline:
        nodes = (d.status()["cluster"] or {}).get("nodes", [])
        if any(n["state"] == "member" and instance in n["info"]["serves"] for n in nodes):
            return
        time.sleep(0.1)  # polling: nothing in the status to wait on
    raise AssertionError(f"no member announces {instance!r}:\n{d.log_text()}")


def url(h: Host, path: str) -> str:
    return f"http://{h.address}:{PORT}{path}"


def active(d: Daemon) -> int:
    serving = d.instance("pp")["serving"]
    return int(serving["active"]) if serving else 0


def test_a_node_without_rank_0_serves_every_dialect_through_rank_0s(
        pair: tuple[TwoHosts, Daemon, Daemon, Client]) -> None:
    hosts, a, b, client = pair
    chat = {"model": "pp", "messages": PROMPT, "max_tokens": 24, "temperature": 0,
            "logit_bias": {EOS: -100}}

    # The same greedy answer through host-b as from host-a itself.
    direct = client.post(url(hosts.a, "/v1/chat/completions"), chat)
    sent_on = client.post(url(hosts.b, "/v1/chat/completions"), chat)
    assert direct["status"] == sent_on["status"] == 200, (direct, sent_on)
    want = json.loads(direct["body"])["choices"][0]["message"]["content"]
    assert want and json.loads(sent_on["body"])["choices"][0]["message"]["content"] == want
    assert json.loads(sent_on["body"])["usage"]["completion_tokens"] == 24

    # Every dialect, whole and streamed, answers through host-b.
    other = {"model": "pp", "max_tokens": 8, "temperature": 0}
    for path, body in [
            ("/v1/completions", {**other, "prompt": "def f():"}),
            ("/v1/messages", {**other, "messages": PROMPT}),
            ("/v1/responses", {"model": "pp", "input": "hi", "max_output_tokens": 8}),
            ("/api/chat", {"model": "pp", "messages": PROMPT, "stream": False,
                           "options": {"num_predict": 8}}),
            ("/api/generate", {"model": "pp", "prompt": "hi", "stream": False,
                               "options": {"num_predict": 8}}),
            ("/api/chat", {"model": "pp", "messages": PROMPT, "options": {"num_predict": 4}}),
            ("/v1/chat/completions", {**chat, "max_tokens": 4, "stream": True})]:
        got = client.post(url(hosts.b, path), body)
        assert got["status"] == 200, (path, got)
        assert got["body"], path
    streamed = client.post(url(hosts.b, "/v1/chat/completions"), {**chat, "stream": True})
    assert streamed["headers"]["Content-Type"].startswith("text/event-stream")
    assert streamed["body"].rstrip().endswith("data: [DONE]")
    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                   for line in streamed["body"].splitlines()
                   if line.startswith("data: {") and json.loads(line[6:])["choices"])
    assert text == want
    # An embedding request goes on as well: the tiny chat model refuses it there, in its words.
    emb = client.post(url(hosts.b, "/v1/embeddings"), {"model": "pp", "input": "x"})
    assert emb["status"] == 400 and json.loads(emb["body"])["error"]["code"] == \
        "wrong_model_kind"
    olla = client.post(url(hosts.b, "/api/embed"), {"model": "pp", "input": "x"})
    assert olla["status"] == 400 and "error" in json.loads(olla["body"])

    # Both nodes list the instance.
    for h in (hosts.a, hosts.b):
        models = json.loads(client.get(url(h, "/v1/models"))["body"])
        assert [m["id"] for m in models["data"]] == ["pp"]
        tags = json.loads(client.get(url(h, "/api/tags"))["body"])
        assert [m["name"] for m in tags["models"]] == ["pp"]
        ps = json.loads(client.get(url(h, "/api/ps"))["body"])
        assert [m["name"] for m in ps["models"]] == ["pp"]

    # A key host-b takes and host-a does not: refused there, and so through host-b.
    refused = client.post(url(hosts.b, "/v1/chat/completions"), chat, key=ONLY_B)
    assert refused["status"] == 401, refused
    assert json.loads(refused["body"])["error"]["code"] == "invalid_api_key"
    assert client.post(url(hosts.a, "/v1/chat/completions"), chat, key=ONLY_B)["status"] == 401
    # One host-b refuses itself, never sent on; in Anthropic's shape under its path.
    wrong = client.post(url(hosts.b, "/v1/messages"), {**other, "messages": PROMPT},
                        key="wrong")
    assert wrong["status"] == 401 and json.loads(wrong["body"])["type"] == "error"
    # The keys' secrets are in neither log.
    for d in (a, b):
        log = d.log_text()
        assert SHARED not in log and ONLY_B not in log

    # A request that says it was sent on already is never sent on again (two nodes whose
    # configs disagree about rank 0 would pass it back and forth): a 503 that says so.
    looped = client.send({"op": "post", "url": url(hosts.b, "/v1/chat/completions"),
                          "body": {**chat, "max_tokens": 2},
                          "headers": {"Authorization": f"Bearer {SHARED}",
                                      "Exod-Proxied-By": "host-b"}})
    assert looped["status"] == 503 and "disagree" in looped["body"]


def test_a_stream_through_the_other_node_arrives_as_made_and_ends_when_the_client_leaves(
        pair: tuple[TwoHosts, Daemon, Daemon, Client]) -> None:
    hosts, a, b, client = pair
    endless = {"model": "pp", "messages": PROMPT, "max_tokens": 100_000, "temperature": 0,
               "logit_bias": {EOS: -100}}
    first = client.send({"op": "stream", "base": url(hosts.b, "/v1"), "key": SHARED,
                         "body": endless})
    assert first["first"]
    # The first chunk was read while rank 0 is generating (100,000 tokens: many minutes),
    # and it goes on until the client leaves: the answer is relayed as it is made.
    a.until_instance("pp", lambda i: i["ranks"][0]["status"] == "serving 1 request(s)",
                     what="rank 0 generating")
    assert client.send("close") == {"closed": True}
    a.until_instance("pp", lambda i: i["ranks"][0]["status"] == "ready",
                     what="rank 0's request to end once the client left")
    assert active(a) == 0
    # And a stream read to its end is the whole answer.
    whole = client.send({"op": "stream", "base": url(hosts.b, "/v1"), "key": SHARED,
                         "body": {**endless, "max_tokens": 16}})
    assert whole["first"]
    rest = client.send("rest")
    assert rest["text"].startswith(whole["first"]) and len(rest["text"]) > len(whole["first"])


def test_rank_0s_node_unreachable_is_a_503_naming_it(
        pair: tuple[TwoHosts, Daemon, Daemon, Client]) -> None:
    hosts, a, b, client = pair
    chat = {"model": "pp", "messages": PROMPT, "max_tokens": 2}
    # host-a's exod dies in the middle of a stream: the client's answer is cut, never ended as
    # if it were whole.
    first = client.send({"op": "stream", "base": url(hosts.b, "/v1"), "key": SHARED,
                         "body": {**chat, "max_tokens": 100_000, "logit_bias": {EOS: -100}}})
    assert first["first"]
    a.send_signal(signal.SIGKILL)
    assert a.proc is not None
    a.proc.wait()
    cut = client.send("rest")
    assert cut.get("error") and cut["text"].startswith(first["first"]), cut
    # Now its address answers and nothing listens there (a refused connection).
    got = client.post(url(hosts.b, "/v1/chat/completions"), chat)
    assert got["status"] == 503 and got["headers"].get("Retry-After")
    err = json.loads(got["body"])["error"]
    assert err["code"] == "node_unreachable" and "'host-a'" in err["message"]
    olla = client.post(url(hosts.b, "/api/chat"), {**chat, "stream": False})
    assert olla["status"] == 503 and "'host-a'" in json.loads(olla["body"])["error"]
    # The link is cut: nothing answers at all; the connection's bound ends the wait.
    hosts.a.link(False)
    got = client.post(url(hosts.b, "/v1/messages"), {**chat, "max_tokens": 2})
    assert got["status"] == 529  # Anthropic's 503: overloaded, retried by its clients
    body = json.loads(got["body"])
    assert body["type"] == "error" and "'host-a'" in body["error"]["message"]


def test_a_node_serves_what_the_cluster_announces_though_its_config_names_none_of_it(
        daemons: Callable[..., Daemon], tiny_model: Path, tmp_path: Path) -> None:
    """Discovery: host-a runs `solo` and announces it; host-b's config names no instance at
    all. host-b lists it and serves it through host-a; a name no node announces stays a 404."""
    key = tmp_path / "cluster.key"
    key.write_text("fedcba9876543210" * 4)
    key.chmod(0o600)
    try:
        hosts = TwoHosts().__enter__()
    except NetnsUnavailable as e:
        pytest.fail(str(e))
    client = None
    try:
        def node(me: Host, other: Host, instances: dict[str, Any]) -> dict[str, Any]:
            return {"node": {"name": me.name},
                    "api": {"listen": f"{me.address}:{PORT}",
                            "keys": [{"name": "shared", "hash": hash_text(SHARED)}]},
                    "cluster": {"key_file": str(key), "peers": [other.address], "mdns": False,
                                "interval": "300ms", "peer_timeout": "5s"},
                    "instances": instances}

        a = daemons(node(hosts.a, hosts.b, {"solo": {"model": str(tiny_model)}}), name="a")
        b = daemons(node(hosts.b, hosts.a, {}), name="b")
        a.start(prefix=tuple(hosts.a.prefix()))
        b.start(prefix=tuple(hosts.b.prefix()))
        a.until_state("solo", "ready")
        announcing(b, "solo")
        client = Client(hosts.b)

        models = json.loads(client.get(url(hosts.b, "/v1/models"))["body"])["data"]
        assert [(m["id"], m["node"]) for m in models] == [("solo", "host-a")]
        tags = json.loads(client.get(url(hosts.b, "/api/tags"))["body"])["models"]
        assert [t["name"] for t in tags] == ["solo"]
        # Its details are its own node's: relayed.
        one = client.get(url(hosts.b, "/v1/models/solo"))
        assert one["status"] == 200 and json.loads(one["body"])["state"] == "ready"
        show = client.post(url(hosts.b, "/api/show"), {"model": "solo"})
        assert show["status"] == 200 and "capabilities" in json.loads(show["body"])

        chat = {"model": "solo", "messages": PROMPT, "max_tokens": 12, "temperature": 0,
                "logit_bias": {EOS: -100}}
        direct = client.post(url(hosts.a, "/v1/chat/completions"), chat)
        sent_on = client.post(url(hosts.b, "/v1/chat/completions"), chat)
        assert direct["status"] == sent_on["status"] == 200, sent_on
        assert json.loads(sent_on["body"])["choices"] == json.loads(direct["body"])["choices"]
        none = client.post(url(hosts.b, "/v1/chat/completions"), {**chat, "model": "nothing"})
        assert none["status"] == 404
    finally:
        if client is not None:
            client.close()
        for d in (locals().get("a"), locals().get("b")):
            if d is not None:
                d.close()
        hosts.close()
