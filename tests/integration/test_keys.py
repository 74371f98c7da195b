"""Named API keys against a live daemon (issue 48), through the official clients: each
dialect's 401 and 403, the instances a key may not see, keys in the wrong place, a key revoked
while its streams run, reloads that add, change and remove keys, a keys file others can read,
and a brute force of 10,000 wrong keys.

One daemon serves the module: two instances of the tiny model, a keys file and a token file.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import anthropic
import ollama
import openai
import pytest
import yaml

from exod.core.keys import hash_text, new_secret
from tests.harness import EXOD, Daemon

EOS = "2"  # the tiny model's <|im_end|>
HELLO = [{"role": "user", "content": "hello"}]
ENDLESS = 100_000  # tokens: a stream that would run for minutes (within tests.models.tiny.CONTEXT)
TOKEN = "a-token-of-the-token-file"


class Keys:
    """The keys file, as the operator writes it: each key's secret kept here for its client."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.secrets: dict[str, str] = {}
        self.entries: dict[str, dict[str, Any]] = {}

    def add(self, name: str, **fields: Any) -> str:
        self.secrets[name] = secret = new_secret()
        self.entries[name] = {"name": name, "hash": hash_text(secret), **fields}
        return secret

    def write(self, mode: int = 0o600) -> None:
        self.path.write_text(yaml.safe_dump(list(self.entries.values())))
        self.path.chmod(mode)


class Served:
    def __init__(self, d: Daemon, keys: Keys) -> None:
        self.d, self.keys, self.url = d, keys, d.api_url()
        parts = urlsplit(self.url)
        self.host, self.port = str(parts.hostname), int(parts.port or 80)

    def secret(self, name: str) -> str:
        return self.keys.secrets[name]

    def openai(self, name: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.secret(name),
                             max_retries=0, timeout=60)

    def anthropic(self, name: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key=self.secret(name), max_retries=0,
                                   timeout=60)

    def ollama(self, name: str) -> ollama.Client:
        return ollama.Client(host=self.url, timeout=60,
                             headers={"Authorization": f"Bearer {self.secret(name)}"})

    def raw(self, method: str, path: str, body: Any = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        data = None if body is None else json.dumps(body).encode()
        try:
            conn.request(method, path, data, {"Content-Type": "application/json",
                                              **(headers or {})})
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, json.loads(raw) if raw.startswith((b"{", b"[")) else {}
        finally:
            conn.close()

    def bearer(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret(name)}"}

    def reload(self) -> None:
        self.d.ctl("reload")

    def told(self) -> str:
        """Everything the daemon logged (to check that no secret is in it)."""
        return self.d.log_text()


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("keys")
    (tmp / "tokens").write_text(TOKEN + "\n")
    (tmp / "tokens").chmod(0o600)
    keys = Keys(tmp / "keys.yaml")
    keys.add("infer", owner="Ann")
    keys.add("manage", scopes=["manage"])
    keys.add("admin", scopes=["admin"])
    keys.add("tiny-only", instances=["tiny"], limits={"in_flight": 4}, weight=2,
             priority="batch")
    keys.write()
    d = Daemon({"api": {"listen": "127.0.0.1:0", "token_file": str(tmp / "tokens"),
                        "keys_file": str(keys.path)},
                "instances": {"tiny": {"model": str(tiny_model), "max_concurrency": 4},
                              "other": {"model": str(tiny_model), "max_concurrency": 1}}},
               name="keys")
    try:
        d.start()
        d.watch_until(lambda s: all(i["state"] == "ready" for i in s["instances"]),
                      what="every instance ready")
        yield Served(d, keys)
    finally:
        d.close()


def secrets_told(s: Served) -> list[str]:
    """The secrets (and the token) that the daemon's log or /metrics shows: none may be."""
    conn = http.client.HTTPConnection(s.host, s.port, timeout=30)
    conn.request("GET", "/metrics", headers=s.bearer("admin"))
    scraped = conn.getresponse().read().decode()
    conn.close()
    told = s.told() + scraped
    return [x for x in [*s.keys.secrets.values(), TOKEN] if x in told]


# ---- each dialect's 401 and 403 ---------------------------------------------------------------
def test_a_key_with_its_scope_is_served_in_every_dialect(served: Served) -> None:
    r = served.openai("infer").chat.completions.create(model="tiny", messages=HELLO,
                                                       max_tokens=2)
    assert r.choices[0].message.content is not None
    m = served.anthropic("infer").messages.create(model="tiny", max_tokens=2, messages=HELLO)
    assert m.content and m.usage.output_tokens >= 1
    assert served.anthropic("infer").messages.count_tokens(model="tiny",
                                                           messages=HELLO).input_tokens > 0
    o = served.ollama("infer").chat(model="tiny", messages=HELLO, options={"num_predict": 2})
    assert o.message.role == "assistant"
    assert {x.model for x in served.ollama("infer").list().models} == {"tiny", "other"}
    # The token file's token is a key with every scope: manage included (pull gets past it).
    status, body = served.raw("POST", "/api/pull", {"model": "tiny"},
                              {"Authorization": f"Bearer {TOKEN}"})
    assert status == 400 and "not from exod's cache" in body["error"]
    status, _ = served.raw("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200


def test_a_key_without_the_scope_gets_403_naming_it_in_every_dialect(served: Served) -> None:
    with pytest.raises(openai.PermissionDeniedError) as oe:  # `manage` alone: no inference
        served.openai("manage").chat.completions.create(model="tiny", messages=HELLO,
                                                        max_tokens=2)
    assert "`infer` scope" in oe.value.message and oe.value.code == "insufficient_scope"
    assert oe.value.response.headers["x-should-retry"] == "false"  # no retry cures a scope
    with pytest.raises(anthropic.PermissionDeniedError) as ae:
        served.anthropic("manage").messages.create(model="tiny", max_tokens=2, messages=HELLO)
    assert ae.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    assert "`infer` scope" in ae.value.message
    with pytest.raises(ollama.ResponseError) as le:
        served.ollama("manage").chat(model="tiny", messages=HELLO)
    assert le.value.status_code == 403 and "`infer` scope" in le.value.error
    # `infer` alone: no pull, no delete, no /metrics; `manage` may pull, `admin` anything.
    for verb in ("pull", "delete"):
        with pytest.raises(ollama.ResponseError) as le:
            getattr(served.ollama("infer"), verb)("tiny")
        assert le.value.status_code == 403 and "`manage` scope" in le.value.error
        with pytest.raises(ollama.ResponseError) as le:  # past the scope: the model is local
            getattr(served.ollama("manage"), verb)("tiny")
        assert le.value.status_code == 400 and "not from exod's cache" in le.value.error
    status, body = served.raw("GET", "/metrics", headers=served.bearer("infer"))
    assert status == 403 and body["error"]["code"] == "insufficient_scope"
    assert "`admin` scope" in body["error"]["message"]
    assert served.raw("GET", "/metrics", headers=served.bearer("admin"))[0] == 200
    r = served.openai("admin").chat.completions.create(model="other", messages=HELLO,
                                                       max_tokens=2)
    assert r.choices[0].message.content is not None


def test_a_missing_or_wrong_key_gets_401_in_every_dialect_naming_nothing_secret(
        served: Served) -> None:
    wrong = new_secret()
    with pytest.raises(openai.AuthenticationError) as oe:
        openai.OpenAI(base_url=served.url + "/v1", api_key=wrong, max_retries=0).models.list()
    assert oe.value.response.headers["x-should-retry"] == "false"  # nor a wrong key
    with pytest.raises(anthropic.AuthenticationError) as ae:
        anthropic.Anthropic(base_url=served.url, api_key=wrong, max_retries=0).messages.create(
            model="tiny", max_tokens=2, messages=HELLO)
    assert ae.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(ollama.ResponseError) as le:
        ollama.Client(host=served.url, headers={"Authorization": f"Bearer {wrong}"}).list()
    assert le.value.status_code == 401
    said = [oe.value.message, ae.value.message, le.value.error]
    for path, shape in (("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic"),
                        ("/api/chat", "ollama")):
        for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": f"Bearer {wrong}"},
                        {"x-api-key": wrong}, {"Authorization": "Bearer \u00e9t\u00e9"}):
            status, body = served.raw("POST", path, {"model": "tiny", "messages": HELLO},
                                      headers)
            assert status == 401, (path, headers, body)
            if shape == "anthropic":
                assert body["type"] == "error"
                said.append(body["error"]["message"])
            elif shape == "ollama":
                said.append(body["error"])
            else:
                assert body["error"]["code"] == "invalid_api_key"
                said.append(body["error"]["message"])
    for text in said:
        assert wrong not in text and not any(s in text for s in served.keys.secrets.values())
    assert served.raw("GET", "/health")[0] == 200  # no key needed


def test_a_key_sees_only_its_instances(served: Served) -> None:
    oc, ac, lc = served.openai("tiny-only"), served.anthropic("tiny-only"), \
        served.ollama("tiny-only")
    assert [m.id for m in oc.models.list()] == ["tiny"]
    assert [m.model for m in lc.list().models] == ["tiny"]
    assert oc.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2).choices
    with pytest.raises(openai.NotFoundError) as oe:  # as if it did not exist
        oc.chat.completions.create(model="other", messages=HELLO, max_tokens=2)
    assert oe.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        oc.models.retrieve("other")
    with pytest.raises(anthropic.NotFoundError):
        ac.messages.create(model="other", max_tokens=2, messages=HELLO)
    for call in (lambda: lc.chat(model="other", messages=HELLO), lambda: lc.show("other"),
                 lambda: lc.generate(model="other", prompt="", keep_alive=0)):
        with pytest.raises(ollama.ResponseError) as le:
            call()
        assert le.value.status_code == 404
    # What a refusal says of `other` is what a name of nothing gets.
    _, hidden = served.raw("POST", "/v1/chat/completions",
                           {"model": "other", "messages": HELLO}, served.bearer("tiny-only"))
    _, absent = served.raw("POST", "/v1/chat/completions",
                           {"model": "nothing", "messages": HELLO}, served.bearer("tiny-only"))
    assert hidden["error"]["message"].replace("other", "X") == \
        absent["error"]["message"].replace("nothing", "X")
    # The status page's data: its instances only, and of the busiest keys only its own line;
    # an admin key sees every instance and every key.
    status, page = served.raw("GET", "/status.json", headers=served.bearer("tiny-only"))
    assert status == 200
    assert [i["name"] for i in page["instances"]] == ["tiny"]
    assert set(page["serving"]) == set(page["logs"]) == {"tiny"}
    assert {k["key"] for k in page["keys"]} <= {"tiny-only"}
    status, page = served.raw("GET", "/status.json", headers=served.bearer("admin"))
    assert status == 200 and {i["name"] for i in page["instances"]} == {"tiny", "other"}


def test_a_key_in_the_wrong_place_is_refused_and_never_logged(served: Served) -> None:
    secret = served.secret("infer")
    for path, headers in ((f"/v1/models?key={secret}", {}),
                          (f"/v1/models?api_key={secret}", served.bearer("infer")),
                          (f"/api/tags?token={secret}", {}),
                          ("/v1/models", {"Authorization": f"Basic {secret}"}),
                          ("/v1/models", {"api-key": secret}),
                          (f"/health?token={secret}", {})):
        status, body = served.raw("GET", path, headers=headers)
        assert status == 401, (path, body)
        assert secret not in json.dumps(body)
    assert served.raw("GET", "/v1/models?limit=3", headers=served.bearer("infer"))[0] == 200
    # Malformed requests that carry a secret: aiohttp's own complaints are logged, not it.
    for raw in (f"GET /v1/models?key={secret} HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
                f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\x01\r\n"
                "\r\n", f"G\x00T /?token={secret} HTTP/1.1\r\n\r\n"):
        with socket.create_connection((served.host, served.port), timeout=10) as sock:
            sock.sendall(raw.encode("latin-1"))
            answer = sock.recv(4096)
            assert answer.split(b" ")[1] == b"400" and secret.encode() not in answer, answer
    assert secrets_told(served) == []


# ---- revocation and reloads -------------------------------------------------------------------
def test_a_revoked_key_ends_its_streams_at_once_in_every_dialect(served: Served) -> None:
    served.keys.add("leaving")
    served.keys.write()
    served.reload()
    ask = {"model": "tiny", "messages": HELLO}
    streams: list[Iterator[Any]] = [
        iter(served.openai("leaving").chat.completions.create(
            **ask, max_tokens=ENDLESS, logit_bias={EOS: -100}, stream=True)),
        # Greedy: the tiny model's answer to HELLO never reaches its end token (it falls into
        # a loop of two tokens); sampled, it sometimes did, and that stream ended by itself.
        iter(served.anthropic("leaving").messages.create(
            **ask, max_tokens=ENDLESS, extra_body={"temperature": 0}, stream=True)),
        iter(served.ollama("leaving").chat(**ask, stream=True, options={
            "num_predict": ENDLESS, "temperature": 0})),
    ]
    for s in streams:
        next(s)  # each one has begun: the head is sent, and its first event
    served.d.until_instance("tiny", lambda i: i["ranks"][0]["status"]
                            == "serving 3 request(s)")
    del served.keys.entries["leaving"]
    served.keys.write()
    started = time.monotonic()
    served.reload()
    errors: list[Exception] = []
    for s in streams:
        with pytest.raises((openai.APIError, anthropic.APIError, ollama.ResponseError)) as e:
            for _ in s:
                pass
        errors.append(e.value)
    assert time.monotonic() - started < 30  # not minutes: each stream ended on its error
    for e in errors:
        assert "revoked" in str(e) and served.secret("leaving") not in str(e)
    openai_error, anthropic_error, _ = errors
    assert isinstance(openai_error, openai.APIError) and openai_error.code == "invalid_api_key"
    assert isinstance(anthropic_error, anthropic.APIStatusError)
    assert anthropic_error.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    # The runner dropped the three generations; the key is refused from now on.
    served.d.until_instance("tiny", lambda i: i["ranks"][0]["status"] == "ready", timeout=30,
                            what="the runner to cancel the revoked key's generations")
    with pytest.raises(openai.AuthenticationError):
        served.openai("leaving").models.list()
    assert any("their key was revoked" in e["message"] for e in served.d.events())


def test_a_reload_adds_changes_and_removes_keys(served: Served) -> None:
    served.keys.add("new")
    with pytest.raises(openai.AuthenticationError):
        served.openai("new").models.list()
    served.keys.write()
    served.reload()
    assert sorted(m.id for m in served.openai("new").models.list()) == ["other", "tiny"]
    served.keys.entries["new"]["instances"] = ["other"]  # changed: its next requests see it
    served.keys.write()
    served.reload()
    assert [m.id for m in served.openai("new").models.list()] == ["other"]
    # A keys file that others can read is refused: the previous keys stay, said in one line.
    served.keys.entries["new"]["instances"] = None
    served.keys.write(mode=0o644)
    served.reload()
    assert [m.id for m in served.openai("new").models.list()] == ["other"]
    said = [e["message"] for e in served.d.events() if "keeps its previous keys" in e["message"]]
    assert said and "has mode 0644" in said[-1] and "\n" not in said[-1]
    # So is one naming an instance that does not exist, at its line and column.
    served.keys.entries["new"]["instances"] = ["gone"]
    served.keys.write()
    served.reload()
    said = [e["message"] for e in served.d.events() if "keeps its previous keys" in e["message"]]
    assert f"{served.keys.path}:" in said[-1] and "no instance is named 'gone'" in said[-1]
    assert [m.id for m in served.openai("new").models.list()] == ["other"]
    del served.keys.entries["new"]
    served.keys.write()
    served.reload()
    with pytest.raises(openai.AuthenticationError):
        served.openai("new").models.list()
    assert served.openai("infer").models.list().data  # the others, untouched
    assert secrets_told(served) == []


def test_a_keys_file_others_can_read_is_refused_at_start(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    keys = Keys(tmp_path / "keys.yaml")
    keys.add("a")
    keys.write(mode=0o644)
    d = daemons({"api": {"listen": "127.0.0.1:0", "keys_file": str(keys.path)},
                 "instances": {}}, name="keys-mode")
    d.start(wait_ready=False)
    assert d.proc is not None and d.proc.wait(60) != 0
    assert f"{keys.path} has mode 0644" in d.log_text()
    check = subprocess.run([*EXOD, "check", "-c", str(d.config_path)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert check.returncode == 78 and "has mode 0644" in check.stderr
    keys.write()
    d.start()
    assert d.status()["daemon"]["api"]["auth"] is True


# ---- brute force ------------------------------------------------------------------------------
@pytest.mark.timing  # /health within a bound in seconds after the flood
def test_ten_thousand_wrong_keys_leave_the_daemon_responsive(served: Served) -> None:
    async def flood() -> tuple[dict[int, int], list[int]]:
        statuses: dict[int, int] = {}
        right: list[int] = []
        connector = aiohttp.TCPConnector(limit=64)
        async with aiohttp.ClientSession(served.url, connector=connector) as session:
            async def wrong(i: int) -> None:
                async with session.get("/v1/models", headers={
                        "Authorization": f"Bearer exod-guess-{i:08d}"}) as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1

            async def meanwhile() -> None:  # the right key, while the flood goes on
                async with aiohttp.ClientSession(served.url) as own:
                    for _ in range(5):
                        async with own.get("/v1/models", headers=served.bearer("infer")) as r:
                            right.append(r.status)
                            await r.read()
                        await asyncio.sleep(0)

            await asyncio.gather(*(wrong(i) for i in range(10_000)), meanwhile())
        return statuses, right

    statuses, right = asyncio.run(flood())
    assert statuses == {401: 10_000} and right == [200] * 5
    t = time.monotonic()
    assert served.raw("GET", "/health")[0] == 200
    took = time.monotonic() - t
    assert took < 1, f"/health took {took:.2f}s after the flood"
    r = served.openai("infer").chat.completions.create(model="tiny", messages=HELLO,
                                                       max_tokens=2)
    assert r.choices[0].message.content is not None
