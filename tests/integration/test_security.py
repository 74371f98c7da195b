"""Hostile clients, neighbours and networks (issue #11), against live daemons: every probe of
the audit, each showing the secure behaviour, then a fuzz of the HTTP API and the control socket
(no 5xx, no traceback in the daemon's log).

Every probe is on loopback and bounded in count and time. Probes that act as another user run
/usr/bin/python3 as uid 65534 (the venv's interpreter may sit under /root, which that user
cannot enter); they need root, as CI has.
"""

from __future__ import annotations

import http.client
import json
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exod.runner.group import wire
from tests.models.tiny import CONTEXT, with_tool_template
from tests.harness import EXOCTL, EXOD, Daemon, port_block

TOKENS = ("first-token", "second-token")
EOS = "2"  # the tiny model's <|im_end|>
HELLO = [{"role": "user", "content": "hello"}]
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
CAP = 4  # max_tokens_cap of the `capped` instance: fuzzed requests that pass stay short


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("acting as another user needs root (CI runs the suite as root)")


class Api:
    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        self.url = daemon.api_url()
        parts = urlsplit(self.url)
        self.host, self.port = str(parts.hostname), int(parts.port or 80)

    def client(self, token: str = TOKENS[0]) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=token, max_retries=0,
                             timeout=60)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None, token: str | None = TOKENS[0],
                timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        h = {"Content-Type": "application/json", **(headers or {})}
        if token:
            h["Authorization"] = f"Bearer {token}"
        try:
            conn.request(method, path, body, h)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def post(self, body: Any, path: str = "/v1/chat/completions", **kw: Any
             ) -> tuple[int, dict[str, Any]]:
        status, _, raw = self.request("POST", path, json.dumps(body).encode(), **kw)
        return status, json.loads(raw)

    def raw(self, data: bytes, timeout: float = 10) -> bytes:
        """Send raw bytes; the server's answer up to its status line, or b"" if it closed
        without one. (Not a half-close after sending: aiohttp takes that for a client gone.)"""
        with socket.create_connection((self.host, self.port), timeout=timeout) as s:
            out = b""
            try:
                s.sendall(data)
                while b"\r\n" not in out and (chunk := s.recv(65536)):
                    out += chunk
            except (TimeoutError, ConnectionResetError, BrokenPipeError):
                pass
            return out


def status_of(answer: bytes) -> int:
    """The status code of a raw HTTP answer (0: the server closed without a word)."""
    if not answer.startswith(b"HTTP/1."):
        return 0
    return int(answer.split(b" ", 2)[1])


def tracebacks(d: Daemon) -> list[str]:
    """Log records with an exception attached, or any line that quotes a traceback (a runner's
    stderr included: its lines are logged by the daemon)."""
    out = []
    for line in d.log_path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            out.append(line)  # not from loguru: e.g. an interpreter crash
            continue
        if rec["record"].get("exception") or "Traceback" in rec["text"]:
            out.append(rec["text"])
    return out


def log_lines(d: Daemon, needle: str) -> int:
    """How many of the daemon's log records say `needle`."""
    return sum(needle in rec["message"] for rec in d.events())


@pytest.fixture(scope="module")
def api(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("security")
    token_file = tmp / "tokens"
    token_file.write_text("# two clients\n" + "\n".join(TOKENS) + "\n")
    token_file.chmod(0o600)  # a secret: closed to other users
    d = Daemon({
        "api": {"listen": "127.0.0.1:0", "token_file": str(token_file),
                "header_timeout": "1s", "body_timeout": "1s", "max_body_kib": 64,
                "cors_origins": ["https://app.example"]},
        "instances": {
            "tiny": {"model": str(tiny_model)},
            "capped": {"model": str(tiny_model), "max_tokens_cap": CAP},
            # A template with tools, so that fuzzed tools, tool turns and grammars get served.
            "tooled": {"model": str(with_tool_template(tiny_model, tmp / "tools")),
                       "max_tokens_cap": CAP},
        }}, name="sec")
    # Daemon() sets control.socket; keep it and add a small connection cap.
    cfg = yaml.safe_load(d.config_path.read_text())
    cfg["control"]["max_connections"] = 8
    d.write_config(cfg)
    try:
        d.start()
        d.watch_until(lambda s: all(i["state"] == "ready" for i in s["instances"]),
                      what="every instance ready")
        yield Api(d)
    finally:
        d.close()


def runner_pid(d: Daemon, name: str) -> int:
    return int(d.instance(name)["ranks"][0]["pid"])


# ---- 1. request fields against the model ------------------------------------------------------
def test_out_of_vocabulary_logit_bias_is_refused_and_the_runner_survives(api: Api) -> None:
    pid = runner_pid(api.d, "tiny")
    client = api.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=HELLO, logit_bias={"1024": 100})
    assert e.value.status_code == 400
    assert e.value.body["param"] == "logit_bias"  # type: ignore[index]
    assert "outside the model's vocabulary" in str(e.value)
    # Many of them, fast (the audit's six in 21 s put the instance in `failed`).
    for bias in ({"1024": 100}, {"99999999": -1}, {"²": 1}, {"-1": 3}, {"1": 1e999}) * 4:
        status, body = api.post({"model": "tiny", "messages": HELLO, "logit_bias": bias})
        assert status == 400 and body["error"]["param"] == "logit_bias", body
    status, _, raw = api.request("POST", "/v1/chat/completions",
                                 b'{"model": "tiny", "messages": [{"role": "user", "content": '
                                 b'"x"}], "logit_bias": {"5": NaN}}')
    assert status == 400 and json.loads(raw)["error"]["param"] == "logit_bias"
    r = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=3,
                                       temperature=0, logit_bias={"1023": 5, EOS: -100})
    assert r.usage is not None and r.usage.completion_tokens == 3
    inst = api.d.instance("tiny")
    assert inst["state"] == "ready" and inst["restarts"] == 0 and runner_pid(api.d, "tiny") == pid


def test_max_tokens_is_clamped_to_the_context_window_and_the_config(api: Api) -> None:
    """Agents ask for 32000 tokens whatever the model (issue 27): past the instance's
    max_tokens_cap or the model's window, max_tokens is clamped, as llama.cpp clamps to its
    server's limit; the answer ends there with finish reason `length`."""
    for n in (10**12, CONTEXT + 1, 32000):  # past the tiny model's window, past the cap
        r = api.client().chat.completions.create(model="capped", messages=HELLO, temperature=0,
                                                 max_tokens=n, logit_bias={EOS: -100})
        assert r.usage is not None and r.usage.completion_tokens == CAP
        assert r.choices[0].finish_reason == "length"
    status, body = api.post({"model": "capped", "prompt": "x", "max_tokens": CAP + 1,
                             "logit_bias": {EOS: -100}}, path="/v1/completions")
    assert status == 200 and body["choices"][0]["finish_reason"] == "length", body
    r = api.client().chat.completions.create(model="capped", messages=HELLO, temperature=0,
                                             logit_bias={EOS: -100})
    assert r.usage is not None and r.usage.completion_tokens == CAP
    assert r.choices[0].finish_reason == "length"


def test_runner_refuses_ids_outside_its_real_logits(tiny_model: Path) -> None:
    """Defence in depth: whatever reaches the runner, no id indexes outside the logits."""
    script = """
import mlx.core as mx
from exod.core.request_rules import RequestError
from exod.runner.serving.model_checks import bias_processor
p = bias_processor({1023: 1.0, 1024: 2.0})
try:
    p(None, mx.zeros((1, 1024)))
    print("accepted")
except RequestError as e:
    print("refused:", e)
print(p.__name__, bias_processor({3: 1.0})(None, mx.zeros((1, 8))).tolist())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    assert out[0].startswith("refused: `logit_bias`: token id 1024 is outside"), out
    assert out[1] == "process [[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]]"


def test_worker_turns_bad_messages_into_peer_lost() -> None:
    """A worker fed an unknown command, an oversized frame or a malformed plan by its control
    connection ends as a lost peer (exit 76, restarted by its daemon), never a crash or a huge
    allocation."""
    script = """
import socket
from exod.wire.protocol import HEADER, encode
from exod.runner.failures import PeerLost
from exod.runner.group.membership import Group
bad = [HEADER.pack(1 << 30), encode({"type": "rm"}),
       encode({"type": "plan", "ops": [{"type": "rm", "id": "x"}], "keep": 0, "step": True}),
       encode({"type": "plan", "ops": [], "keep": -1, "step": True}),
       encode({"type": "plan", "ops": [{"type": "admit", "request": {"type": "generate",
                                                                       "id": 1}}]}),
       HEADER.pack(2) + b"[1"]
for frame in bad:
    a, b = socket.socketpair()
    g = Group(None, 1, 2, 5.0, None, ctrl={0: b})
    a.sendall(frame)
    try:
        g.recv()
        print("accepted")
    except PeerLost as e:
        print("peer lost:", e)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    assert out == [
        "peer lost: bad message from rank 0 (1073741824 bytes; at most 268435456)",
        "peer lost: bad message from rank 0: unknown message type 'rm'",
        "peer lost: bad message from rank 0: plan.ops: unknown message type 'rm'",
        "peer lost: bad message from rank 0: plan: keep -1 is negative",
        "peer lost: bad message from rank 0: plan.ops: admit.request: generate.id: unexpected "
        "value 1",
        "peer lost: bad message from rank 0: bad JSON frame: Expecting ',' delimiter: line 1 "
        "column 3 (char 2)"], out


# ---- malformed input: 4xx, never 500 ---------------------------------------------------------
def test_malformed_requests_get_4xx_never_500(api: Api) -> None:
    deep = b"[" * 200_000 + b"]" * 200_000
    assert api.request("POST", "/v1/chat/completions", deep)[0] == 413  # over max_body
    nested = b'{"model": "tiny", "messages": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    status, _, body = api.request("POST", "/v1/chat/completions", nested)
    assert status == 400 and b"not valid JSON" in body
    assert api.request("POST", "/v1/chat/completions", b"\xff\xfe")[0] == 400
    # A template variable nested 500 deep passed its rule, then overflowed the stack where the
    # daemon writes the request to the runner (a 500).
    kwargs = (b'{"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "q"}],'
              b' "chat_template_kwargs": {"x": ' + b"[" * 500 + b"]" * 500 + b"}}")
    status, _, body = api.request("POST", "/v1/chat/completions", kwargs)
    assert status == 400 and json.loads(body)["error"]["param"] == "chat_template_kwargs", body
    # Announced too big: refused at once, before a byte of the body is read.
    with socket.create_connection((api.host, api.port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                  b"Authorization: Bearer first-token\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 15728640\r\n\r\n")
        assert status_of(s.recv(65536)) == 413
    # Bytes that are not UTF-8 in the Authorization header: 401, not a traceback.
    answer = api.raw(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n"
                     b"Authorization: Bearer \xc3\xa9\xff\r\nConnection: close\r\n\r\n")
    assert status_of(answer) == 401
    assert tracebacks(api.d) == []


def test_text_fields_that_are_not_text_get_400_and_odd_text_is_served(api: Api) -> None:
    # A lone surrogate is valid JSON (`"\\ud800"`) but no UTF-8: it used to reach the runner
    # channel's encoder and fail there, after admission.
    chat = {"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "LONE"}]}
    parts = {**chat, "messages": [{"role": "user", "content": [{"type": "text", "text": "LONE"}]}]}
    plain = {"model": "tiny", "max_tokens": 1, "prompt": "LONE"}
    stop = {**plain, "prompt": "x", "stop": ["LONE"]}
    call = {"id": "LONE", "type": "function", "function": {"name": "f", "arguments": {}}}
    replay = {**chat, "messages": [{"role": "user", "content": "q"},
                                   {"role": "assistant", "tool_calls": [call]},
                                   {"role": "tool", "tool_call_id": "LONE", "content": "r"}]}
    asked = {**chat, "messages": [{"role": "user", "content": "q"}]}
    schema = {**asked, "response_format": {"type": "json_schema", "json_schema": {
        "name": "o", "schema": {"type": "string", "pattern": "LONE"}}}}
    kwargs = {**asked, "chat_template_kwargs": {"x": "LONE"}}
    probes = [("/v1/chat/completions", chat, "content"),
              ("/v1/chat/completions", parts, "content[0].text"),
              ("/v1/completions", plain, "prompt"), ("/v1/completions", stop, "stop"),
              # past calls, ids, schemas, template variables: were 500s when encoded
              ("/v1/chat/completions", replay, "tool_calls[0].id"),
              ("/v1/chat/completions", schema, "schema"),
              ("/v1/chat/completions", kwargs, "chat_template_kwargs")]
    for path, body, param in probes:
        raw = json.dumps(body).replace("LONE", "\\ud800").encode()
        status, _, answer = api.request("POST", path, raw)
        assert status == 400, (status, answer)
        assert json.loads(answer)["error"]["param"].endswith(param), answer
    # A list where a dialect reads a string it looks up (was a 500: unhashable).
    for path, body, param in (
            ("/v1/responses", {"model": "tiny", "input": [{"type": [], "content": "x"}]},
             "input[0].type"),
            ("/v1/responses", {"model": "tiny", "input": "x", "reasoning": {"effort": []}},
             "reasoning.effort")):
        status, _, answer = api.request("POST", path, json.dumps(body).encode())
        assert status == 400 and json.loads(answer)["error"]["param"] == param, answer
    # NUL bytes, control characters and the largest allowed stop strings are text: served.
    ok = {"model": "tiny", "max_tokens": 2, "prompt": "a\u0000b\u001b[2J\ufeff",
          "stop": ["\u0000" + "é" * 1023] * 16}
    raw = json.dumps(ok, ensure_ascii=False).encode()
    status, _, answer = api.request("POST", "/v1/completions", raw)
    assert status == 200, answer
    assert tracebacks(api.d) == []


# ---- browsers ----------------------------------------------------------------------------
def test_dns_rebinding_and_form_posts_are_refused(api: Api) -> None:
    status, _, body = api.request("GET", "/v1/models",
                                  headers={"Host": f"attacker.example:{api.port}"})
    assert status == 421 and json.loads(body)["error"]["code"] == "host_not_allowed"
    for host in (f"localhost:{api.port}", f"127.0.0.1:{api.port}"):
        assert api.request("GET", "/v1/models", headers={"Host": host})[0] == 200
    chat = json.dumps({"model": "capped", "messages": HELLO}).encode()
    status, _, body = api.request("POST", "/v1/chat/completions", chat,
                                  headers={"Content-Type": "text/plain"})
    assert status == 415 and json.loads(body)["error"]["code"] == "unsupported_media_type"


def test_cors_only_for_configured_origins(api: Api) -> None:
    good, evil = "https://app.example", "https://evil.example"
    _, headers, _ = api.request("GET", "/v1/models", headers={"Origin": evil})
    assert not any(k.startswith("access-control") for k in headers)
    _, headers, _ = api.request("GET", "/v1/models", headers={"Origin": good})
    assert headers["access-control-allow-origin"] == good
    status, headers, _ = api.request("OPTIONS", "/v1/chat/completions", token=None,
                                     headers={"Origin": good,
                                              "Access-Control-Request-Method": "POST"})
    assert status == 204 and "POST" in headers["access-control-allow-methods"]
    status, headers, _ = api.request("OPTIONS", "/v1/chat/completions", token=None,
                                     headers={"Origin": evil})
    assert status == 403 and "access-control-allow-origin" not in headers


# ---- slow and idle clients -------------------------------------------------------------------
def test_slowloris_is_cut_off_by_the_header_timeout(api: Api) -> None:
    start = time.monotonic()
    with socket.create_connection((api.host, api.port), timeout=15) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-A: 1\r\n")  # never finished
        assert s.recv(1) == b""  # closed by the server
    assert time.monotonic() - start < 10  # header_timeout is 1s
    # A body that never arrives: 408 after body_timeout.
    with socket.create_connection((api.host, api.port), timeout=15) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n"
                  b"Authorization: Bearer first-token\r\nContent-Type: application/json\r\n\r\n"
                  b'{"model"')
        assert status_of(s.recv(65536)) == 408


def test_control_socket_limits(api: Api) -> None:
    d = api.d
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(d.socket))
        s.sendall(b"x" * (70 * 1024) + b"\n")
        reply = json.loads(s.makefile("rb").readline())
    assert reply["ok"] is False and "longer than" in reply["error"]
    # More silent connections than control.max_connections (8): the oldest are dropped and
    # exoctl still gets through.
    silent = [socket.socket(socket.AF_UNIX) for _ in range(20)]
    try:
        for s in silent:
            s.connect(str(d.socket))
        assert json.loads(d.ctl("status", "--json").stdout)["daemon"]["state"] == "running"
    finally:
        for s in silent:
            s.close()
    assert tracebacks(d) == []


# ---- tokens ----------------------------------------------------------------------------------
def test_several_tokens_and_rotation_by_reload(api: Api) -> None:
    for token in TOKENS:
        assert api.request("GET", "/v1/models", token=token)[0] == 200
    token_file = Path(api.d.status()["daemon"]["api"]["token_file"])
    original = token_file.read_text()
    try:
        token_file.write_text("rotated-token\n")
        api.d.ctl("reload")
        assert api.request("GET", "/v1/models", token=TOKENS[0])[0] == 401
        assert api.request("GET", "/v1/models", token="rotated-token")[0] == 200
    finally:
        token_file.write_text(original)
        api.d.ctl("reload")
    assert api.request("GET", "/v1/models", token=TOKENS[1])[0] == 200


# ---- fuzz: several thousand malformed inputs, no 5xx, no traceback ---------------------------
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
                    | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
FIELDS = ("model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature",
          "top_p", "stop", "seed", "logit_bias", "stream", "stream_options", "n", "echo",
          "top_k", "min_p", "repetition_penalty", "repetition_context_size", "presence_penalty",
          "frequency_penalty", "logprobs", "top_logprobs", "chat_template_kwargs", "tools",
          "tool_choice", "parallel_tool_calls", "response_format", "user", "reasoning_effort")
NUMBER = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**20, 10**20)
NAME = st.sampled_from(["add", "get", ""]) | st.text(max_size=8) | JSON
SCHEMA = st.sampled_from([
    {"type": "object"}, {"type": "string", "maxLength": 3}, {"enum": [1, "a", None]},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
     "additionalProperties": False},
    {"type": "array", "uniqueItems": True}, {"type": "string", "pattern": "^(?=a)b$"},
    {"$ref": "#/$defs/none"}, {"type": "bogus"}]) | JSON
TOOL = st.fixed_dictionaries({"type": st.just("function") | JSON, "function": st.fixed_dictionaries(
    {"name": NAME}, optional={"parameters": SCHEMA, "strict": st.booleans() | JSON,
                              "description": st.text(max_size=10) | JSON})}) | JSON
CALL = st.fixed_dictionaries({"id": st.text(max_size=6) | JSON, "type": st.just("function") | JSON,
                              "function": st.fixed_dictionaries({
                                  "name": NAME, "arguments": st.sampled_from(
                                      ['{"a": 1}', "{", "", "[]"]) | JSON})}) | JSON
TURN = (st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "bogus"]) | JSON,
                               "content": st.text(max_size=30) | JSON})
        | st.fixed_dictionaries({"role": st.just("assistant"),
                                 "content": st.none() | st.text(max_size=10) | JSON},
                                optional={"tool_calls": st.lists(CALL, max_size=2) | JSON})
        | st.fixed_dictionaries({"role": st.just("tool"), "content": st.text(max_size=10) | JSON},
                                optional={"tool_call_id": st.text(max_size=6) | JSON}))
NEAR = {"model": st.sampled_from(["capped", "tooled", "nope", ""]) | JSON,
        "messages": st.lists(TURN, max_size=3) | JSON,
        "tools": st.lists(TOOL, max_size=3) | JSON,
        "tool_choice": st.sampled_from(["auto", "none", "required", "bogus"])
        | st.fixed_dictionaries({"type": st.just("function") | JSON,
                                 "function": st.fixed_dictionaries({"name": NAME}) | JSON}) | JSON,
        "parallel_tool_calls": st.booleans() | JSON,
        "response_format": st.fixed_dictionaries(
            {"type": st.sampled_from(["json_object", "json_schema", "text", "yaml"]) | JSON},
            optional={"json_schema": st.fixed_dictionaries(
                {"name": st.text(max_size=6) | JSON, "schema": SCHEMA},
                optional={"strict": st.booleans() | JSON}) | JSON}) | JSON,
        "logit_bias": st.dictionaries(st.text("0123456789²-", min_size=1, max_size=6),
                                      st.floats(-200, 200) | JSON, max_size=3) | JSON,
        "max_tokens": st.integers(-5, 10**13) | JSON,
        "stream": st.booleans() | JSON,
        **dict.fromkeys(("top_k", "min_p", "repetition_penalty", "repetition_context_size",
                         "presence_penalty", "frequency_penalty"), NUMBER | JSON),
        "logprobs": st.booleans() | st.integers(-2, 30) | JSON,
        "top_logprobs": st.integers(-2, 30) | JSON,
        "chat_template_kwargs": st.dictionaries(
            st.sampled_from(["enable_thinking", "chat_template", "tools", "x-y", ""]) | st.text(),
            JSON, max_size=3) | JSON}


@st.composite
def bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"model": draw(st.sampled_from(["capped", "tooled"])),
                            "messages": HELLO, "prompt": "x"}
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
        body[key] = draw(NEAR.get(key, JSON))
    if draw(st.booleans()):
        body.pop(draw(st.sampled_from(sorted(body))))
    return body


AGENT_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "response_format")


def test_fuzz_http_json_bodies(api: Api) -> None:
    statuses: dict[int, int] = {}
    agents: dict[int, int] = {}  # the statuses of bodies with tools or a grammar, or tool turns

    @settings(max_examples=1500, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=bodies(), path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
    def probe(body: dict[str, Any], path: str) -> None:
        # Each endpoint refuses the other's text field by name: keep only its own.
        body.pop("prompt" if path == "/v1/chat/completions" else "messages", None)
        raw = json.dumps(body, allow_nan=True).encode()
        try:
            status, _, _ = api.request("POST", path, raw)
        except (BrokenPipeError, ConnectionResetError):
            # This daemon's header_timeout is 1 s: on a loaded machine the server may close a
            # fresh connection before the loop reads its request. Closing is no 5xx, and rare.
            status = 0
        statuses[status] = statuses.get(status, 0) + 1
        if any(k in body for k in AGENT_FIELDS) or "tool" in json.dumps(body.get("messages")):
            agents[status] = agents.get(status, 0) + 1
        assert status < 500, (status, body)

    probe()
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0, statuses
    assert agents.get(200, 0) > 0 and agents.get(400, 0) > 0, agents
    assert statuses.get(0, 0) <= sum(statuses.values()) // 20, statuses
    assert tracebacks(api.d) == []


LINE = st.binary(max_size=60).filter(lambda b: b"\n" not in b)


def test_fuzz_raw_http(api: Api) -> None:
    methods = st.sampled_from([b"GET", b"POST", b"PUT", b"OPTIONS", b"\xff", b"", b"G ET"])
    paths = st.sampled_from([b"/health", b"/v1/models", b"/v1/chat/completions", b"/%zz",
                             b"*", b"/v1/models/" + b"a" * 9000]) | LINE
    header = st.tuples(LINE, LINE).map(lambda kv: kv[0] + b": " + kv[1])
    known = st.sampled_from([b"Host: localhost", b"Host: evil.example", b"Content-Length: -1",
                             b"Content-Length: 99999999999", b"Transfer-Encoding: chunked",
                             b"Content-Type: application/json", b"Authorization: Bearer \xff",
                             b"Origin: https://app.example", b"X: " + b"y" * 9000])

    @settings(max_examples=1000, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(method=methods, path=paths, version=st.sampled_from([b"HTTP/1.1", b"HTTP/1.0",
                                                                b"HTTP/9", b""]),
           hdrs=st.lists(header | known, max_size=5), body=st.binary(max_size=200))
    def probe(method: bytes, path: bytes, version: bytes, hdrs: list[bytes],
              body: bytes) -> None:
        data = b" ".join(x for x in (method, path, version) if x) + b"\r\n"
        data += b"".join(h + b"\r\n" for h in hdrs) + b"\r\n" + body
        status = status_of(api.raw(data, timeout=10))
        assert status < 500, (status, data[:300])

    probe()
    assert tracebacks(api.d) == []
    assert api.request("GET", "/health", token=None)[0] == 200


def test_fuzz_control_socket(api: Api) -> None:
    d = api.d
    commands = st.sampled_from(["status", "start", "reload", "wait", "bogus", "", "watch"])
    requests = (st.fixed_dictionaries({"cmd": commands | JSON},
                                      optional={"name": st.sampled_from(["nope", ""]) | JSON})
                .map(lambda r: json.dumps(r, allow_nan=True).encode())
                | st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"")))

    @settings(max_examples=1000, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(line=requests)
    def probe(line: bytes) -> None:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(20)
            s.connect(str(d.socket))
            s.sendall(line + b"\n")
            first = s.makefile("rb").readline()  # `watch` streams: its first line will do
        assert first, line
        json.loads(first)

    probe()
    assert tracebacks(d) == []
    assert {i["name"]: i["state"] for i in d.status()["instances"]} == \
        {"tiny": "ready", "capped": "ready", "tooled": "ready"}


# ---- sockets and directories: only ours are trusted ------------------------------------------
def small_daemon(daemons: Callable[..., Daemon], **control: Any) -> Daemon:
    d = daemons({"instances": {}, "api": {"listen": "127.0.0.1:0"}}, name="sec")
    d.write_config({"control": {"socket": str(d.socket), **control},
                    "api": {"listen": "127.0.0.1:0"}, "instances": {}})
    return d


def test_runtime_dir_is_private_and_socket_has_its_mode(daemons: Callable[..., Daemon]) -> None:
    d = small_daemon(daemons, mode="0600").start()
    assert stat.S_IMODE(os.stat(d.socket.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(d.socket).st_mode) == 0o600
    d2 = small_daemon(daemons).start()  # the default 0660: a group may use it
    assert stat.S_IMODE(os.stat(d2.socket.parent).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(d2.socket).st_mode) == 0o660


def test_exod_refuses_a_runtime_dir_someone_else_owns(daemons: Callable[..., Daemon]) -> None:
    need_root()
    d = small_daemon(daemons)
    d.socket.parent.mkdir()
    d.socket.parent.chmod(0o777)
    os.chown(d.socket.parent, NOBODY, NOBODY)
    d.start(wait_ready=False)
    assert d.proc is not None and d.proc.wait(60) == 1
    assert "belongs to" in d.log_text() and not d.socket.exists()


def test_exoctl_refuses_a_hijacked_socket_and_sends_it_nothing(tmp_path: Path) -> None:
    need_root()
    tmp_path.chmod(0o1777)  # like /tmp
    fake = tmp_path / "exod-0"
    fake.mkdir()
    heard: list[bytes] = []
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(fake / "control.sock"))
    srv.listen()
    srv.settimeout(0.2)
    fake.chmod(0o777)
    os.chown(fake, NOBODY, NOBODY)
    token = tmp_path / "token"
    token.write_text("users-secret\n")
    token.chmod(0o600)

    def serve() -> None:  # the impostor: fake status, and it keeps whatever it is sent
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                heard.append(conn.recv(65536))
                conn.sendall(json.dumps({"ok": True, "daemon": {"api": {
                    "url": "http://127.0.0.1:9", "token_file": str(token)}},
                    "instances": []}).encode() + b"\n")

    stop = threading.Event()
    t = threading.Thread(target=serve)
    t.start()
    try:
        for args in (["status"], ["chat", "x", "hi"]):
            res = subprocess.run([*EXOCTL, "--socket", str(fake / "control.sock"), *args],
                                 capture_output=True, text=True, timeout=30, check=False)
            assert res.returncode == 1 and f"{fake} belongs to" in res.stderr, res.stderr
    finally:
        stop.set()
        t.join(5)
        srv.close()
    assert heard == []


def test_exoctl_checks_the_uid_of_the_process_behind_the_socket(tmp_path: Path) -> None:
    need_root()
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(run / "control.sock"))
    # Our own folder and socket file, but the listening process is someone else's (the
    # kernel records who called listen()).
    impostor = subprocess.Popen(
        [SYSTEM_PYTHON, "-c", "import socket, sys; s = socket.socket(fileno=int(sys.argv[1]));"
                              " s.listen(); print('listening', flush=True);"
                              " c, _ = s.accept(); c.recv(100); c.sendall(b'{\"ok\": true}\\n')",
         str(srv.fileno())], pass_fds=(srv.fileno(),), user=NOBODY, group=NOBODY,
        extra_groups=[], stdout=subprocess.PIPE)
    try:
        assert impostor.stdout is not None and impostor.stdout.readline() == b"listening\n"
        res = subprocess.run([*EXOCTL, "--socket", str(run / "control.sock"), "status"],
                             capture_output=True, text=True, timeout=30, check=False)
        assert res.returncode == 1 and f"runs as uid {NOBODY}" in res.stderr, res.stderr
    finally:
        impostor.kill()
        impostor.wait(10)
        srv.close()


def test_exod_checks_the_uid_of_each_client(daemons: Callable[..., Daemon]) -> None:
    need_root()
    d = small_daemon(daemons, mode="0666").start()
    # A careless operator opens the folders: the file permissions no longer protect the socket.
    for folder in (d.dir, d.socket.parent):
        folder.chmod(0o755)
    # It is answered (and dropped) before it can even send a request.
    probe = ("import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]);"
             " print(s.makefile().readline())")
    res = subprocess.run([SYSTEM_PYTHON, "-c", probe, str(d.socket)], capture_output=True,
                         text=True, timeout=30, check=False, user=NOBODY, group=NOBODY,
                         extra_groups=[])
    assert res.returncode == 0, res.stderr
    reply = json.loads(res.stdout)
    assert reply["ok"] is False and f"uid {NOBODY} may not use" in reply["error"]
    assert d.ctl("status").returncode == 0  # root still may


# ---- config safety -------------------------------------------------------------------------
def test_control_socket_never_deletes_a_regular_file(daemons: Callable[..., Daemon]) -> None:
    d = small_daemon(daemons)
    precious = d.dir / "precious.txt"
    precious.write_text("data")
    d.write_config({"control": {"socket": str(precious)}, "instances": {}})
    res = subprocess.run([*EXOD, "check", "-c", str(d.config_path)], capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 78 and "exists and is a file that is not a socket" in res.stderr
    d.start(wait_ready=False)
    assert d.proc is not None and d.proc.wait(60) == 78
    assert precious.read_text() == "data"


def test_public_listen_needs_a_token_or_insecure_public(daemons: Callable[..., Daemon]) -> None:
    d = small_daemon(daemons)
    d.write_config({"control": {"socket": str(d.socket), "mode": "0666"},
                    "api": {"listen": "0.0.0.0:0"}, "instances": {}})
    res = subprocess.run([*EXOD, "check", "-c", str(d.config_path)], capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr  # warnings never fail a valid file
    assert "reachable from other machines" in res.stderr and "0666" in res.stderr
    d.start(wait_ready=False)
    assert d.proc is not None and d.proc.wait(60) == 78
    assert "refusing to start" in d.log_text() and not d.socket.exists()
    d.write_config({"control": {"socket": str(d.socket)},
                    "api": {"listen": "0.0.0.0:0", "insecure_public": True}, "instances": {}})
    d.start()
    assert d.status()["daemon"]["state"] == "running"


# ---- ranks authenticate ----------------------------------------------------------------------
class Knocker:
    """Strangers on rank 0's control port, without pause: each connects and then sends
    garbage, or an exod rank's greeting of another version, or the start of one of ours, or
    nothing; and either leaves at once or holds the connection open for longer than a
    handshake may take."""

    KNOCKS = [b"", b"\x00\x00\x00\x01EXOD-GROUP-1\n" + b"\0" * 128,
              b"EXOD-GROUP-5\n" + b"\0" * 32, wire.PREAMBLE + b"\x00\x00",
              wire.PREAMBLE + b"\xff" * 64, b"GET / HTTP/1.0\r\n\r\n"]

    def __init__(self, port: int, threads: int = 4) -> None:
        self.port, self.stop = port, threading.Event()
        self.landed = 0  # connections rank 0 accepted (the port is open only while forming)
        self.threads = [threading.Thread(target=self._knock, args=(i,)) for i in range(threads)]

    def __enter__(self) -> Knocker:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _knock(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    self.landed += 1
                    s.sendall(self.KNOCKS[(n + i) % len(self.KNOCKS)])
                    if n % 2:  # hold it open past a handshake's time, or until dropped
                        s.settimeout(3)
                        s.recv(4096)
            except OSError:
                self.stop.wait(0.005)  # not listening (yet, or any more): knock again soon


def test_strangers_knocking_cannot_join_delay_or_restart_a_group(
        daemons: Callable[..., Daemon], tiny_model_factory: Callable[..., Path]) -> None:
    """Strangers knock on rank 0's control port throughout the group's formation (rank 1
    connects 4 s late, so that they do) and while it serves: the group forms with its real
    ranks at the first attempt, never restarts, and serves. Rank 0 used to check one handshake
    at a time: a stranger held it up, and a real rank waited behind it past peer_timeout."""
    base = port_block(3)
    d = daemons({"instances": {"pp": {
        "model": str(tiny_model_factory(layers=2)), "shards": 2, "port_base": base,
        "env": {"EXOD_DOUBLE": "group", "EXOD_DOUBLE_GROUP_RANK": "1",
                "EXOD_DOUBLE_CONTROL_DELAY": "4"}}}}, name="sec")
    with Knocker(base + 2) as knocks:
        d.start()
        inst = d.until_state("pp", "ready")
        formed = knocks.landed
        c = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0)
        for _ in range(3):  # served while the knocking goes on
            r = c.chat.completions.create(model="pp", messages=HELLO, max_tokens=3,
                                          temperature=0, logit_bias={EOS: -100})
            assert r.usage is not None and r.usage.completion_tokens == 3
    assert formed >= 8, formed  # they did knock while the group formed
    after = d.instance("pp")
    assert inst["restarts"] == after["restarts"] == 0
    assert [r["pid"] for r in after["ranks"]] == [r["pid"] for r in inst["ranks"]]
    assert all(r["last_exit"] is None for r in after["ranks"])
    for why in ("not an exod rank (bad greeting)", "no handshake within 2s",
                "it speaks EXOD-GROUP-5, this rank EXOD-GROUP-8"):
        assert log_lines(d, why) >= 1, why
    # The secret: a 0600 file in a 0700 folder; never on a command line or in the environment.
    key_file = d.socket.parent / "groups" / "pp.key"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(key_file.parent).st_mode) == 0o700
    secret = key_file.read_bytes().strip()
    for rank in inst["ranks"]:
        for what in ("cmdline", "environ"):
            assert secret not in Path(f"/proc/{rank['pid']}/{what}").read_bytes()


def test_a_rank_of_another_version_is_refused_with_the_reason(
        daemons: Callable[..., Daemon], tiny_model_factory: Callable[..., Path]) -> None:
    """Rank 1 speaks the group protocol of another exod release: rank 0 refuses it and says
    why in its log, and so does rank 1, whose reason is the group's in `exoctl status` while it
    backs off; never a group of two versions."""
    d = daemons({"instances": {"pp": {
        "model": str(tiny_model_factory(layers=2)), "shards": 2,
        "backoff": {"initial": "30s", "jitter": 0},
        "env": {"EXOD_DOUBLE": "group", "EXOD_DOUBLE_GROUP_RANK": "1",
                "EXOD_DOUBLE_GROUP_VERSION": "5"}}}}, name="sec")
    d.start()
    leader = "refused a control connection from 127.0.0.1: it speaks EXOD-GROUP-5, this rank " \
             "EXOD-GROUP-8 (every host of a group must run the same exod version)"
    worker = "rank 0 speaks EXOD-GROUP-8, this rank EXOD-GROUP-5 (every host of a group must " \
             "run the same exod version)"
    inst = d.until_instance("pp", lambda i: i["state"] == "backoff", what="backing off")
    assert worker in inst["ranks"][1]["error"], inst
    row = next(line for line in d.ctl("status").stdout.splitlines() if line.startswith("pp "))
    assert worker in row and row.endswith(f"; {inst['reason']}"), row
    assert log_lines(d, leader) >= 1 and log_lines(d, worker) >= 1
    # One line each, nothing else: no traceback.
    assert tracebacks(d) == []


# ---- process hygiene ----------------------------------------------------------------------
def test_runners_inherit_no_stray_descriptors(daemons: Callable[..., Daemon],
                                              tiny_model: Path) -> None:
    d = daemons({"instances": {"tiny": {"model": str(tiny_model)}}}, name="sec")
    r, w = os.pipe()
    os.set_inheritable(w, True)
    try:
        with open(d.log_path, "ab") as log:
            d.proc = subprocess.Popen(
                [*EXOD, "run", "-c", str(d.config_path), "--log-format", "json"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=d.env, cwd=d.dir,
                pass_fds=(w,))
        d.wait_ready()
        d.until_state("tiny", "ready")
        leaked = f"pipe:[{os.fstat(w).st_ino}]"

        def fds(pid: int) -> set[str]:
            out = set()
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
                except FileNotFoundError:
                    pass
            return out

        assert leaked in fds(d.proc.pid)  # exod got it from its parent ...
        assert leaked not in fds(runner_pid(d, "tiny"))  # ... and kept it from its runner
    finally:
        os.close(r)
        os.close(w)


# ---- descriptors and floods ------------------------------------------------------------------
def open_idle(host: str, port: int, n: int) -> list[socket.socket]:
    """n connections that each sent half a request head, as a slowloris does."""
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n")
        socks.append(s)
    return socks


@pytest.fixture
def many_fds() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def limited_daemon(daemons: Callable[..., Daemon], **api_cfg: Any) -> Daemon:
    d = small_daemon(daemons)
    d.write_config({"control": {"socket": str(d.socket)},
                    "api": {"listen": "127.0.0.1:0", "header_timeout": "5m", **api_cfg},
                    "instances": {}})
    return d.start(prefix=("prlimit", "--nofile=1024:1024", "--"))


def test_thousand_idle_connections_at_1024_fds(daemons: Callable[..., Daemon],
                                               many_fds: None) -> None:
    d = limited_daemon(daemons)
    api = Api(d)
    idle = open_idle(api.host, api.port, 1000)
    try:
        start = time.monotonic()
        status, headers, body = api.request("GET", "/health", token=None)
        assert status == 200 and json.loads(body)["status"] == "ok"
        assert d.ctl("status", timeout=30).returncode == 0
        assert time.monotonic() - start < 10
        # CORS is off by default: no preflight answer, no Access-Control headers.
        status, headers, _ = api.request("OPTIONS", "/v1/models", headers={"Origin": "https://a"})
        assert status == 405 and not any(k.startswith("access-control") for k in headers)
    finally:
        for s in idle:
            s.close()
    assert log_lines(d, "closing the oldest idle") <= 3  # rate-limited, not one per connection
    assert tracebacks(d) == []


def test_descriptor_exhaustion_backs_off_and_logs_once(daemons: Callable[..., Daemon],
                                                       many_fds: None) -> None:
    d = limited_daemon(daemons, max_connections=4096)  # no cap: the fds run out
    api = Api(d)
    idle = open_idle(api.host, api.port, 1100)
    try:
        deadline = time.monotonic() + 30
        while log_lines(d, "out of system resource") == 0:  # the daemon's own report
            assert time.monotonic() < deadline, d.log_text()
            time.sleep(0.1)  # a log file has no event to wait on
        assert d.proc is not None and d.proc.poll() is None
    finally:
        for s in idle:
            s.close()
    # Once descriptors are free again, asyncio's accept resumes (it backed off for a second).
    deadline = time.monotonic() + 30
    while True:
        try:
            if api.request("GET", "/health", token=None)[0] == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, d.log_text()
        time.sleep(0.2)  # polling a listener that backs off: nothing to wait on
    out_of_fds = log_lines(d, "out of system resource")
    assert 1 <= out_of_fds <= 3, out_of_fds  # at most once per 10s, however many accept()s
    assert "Traceback" not in d.log_path.read_text()
    d.send_signal(signal.SIGTERM)
    assert d.proc.wait(60) == 0


# ---- the other dialects: the same guards, the same fuzzing ----------------------------------
DIALECT_FIELDS = ("system", "max_tokens", "stop_sequences", "tools", "tool_choice", "thinking",
                  "output_config", "metadata", "temperature", "top_k", "input", "instructions",
                  "max_output_tokens", "text", "reasoning", "store", "previous_response_id",
                  "include", "truncation", "stream")
BLOCK = st.fixed_dictionaries({"type": st.sampled_from(["text", "tool_use", "tool_result",
                                                        "thinking", "image", "input_text",
                                                        "function_call_output"]) | JSON,
                               "text": st.text(max_size=10) | JSON}) | JSON
DIALECT_NEAR = {
    "messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool"]) | JSON,
         "content": st.text(max_size=20) | st.lists(BLOCK, max_size=3) | JSON}), max_size=3),
    "input": st.text(max_size=20) | st.lists(st.fixed_dictionaries(
        {"type": st.sampled_from(["message", "function_call", "function_call_output",
                                  "reasoning", "item_reference"]) | JSON,
         "role": st.sampled_from(["user", "assistant", "developer"]) | JSON,
         "content": st.text(max_size=10) | st.lists(BLOCK, max_size=2) | JSON,
         "call_id": st.text(max_size=5) | JSON}), max_size=3) | JSON,
    "tools": st.lists(st.fixed_dictionaries({"type": st.sampled_from(
        ["custom", "function", "web_search"]) | JSON, "name": st.text(max_size=5) | JSON,
        "input_schema": JSON, "parameters": JSON}), max_size=2) | JSON,
    "tool_choice": st.fixed_dictionaries({"type": st.sampled_from(
        ["auto", "any", "tool", "none", "function"]) | JSON, "name": JSON}) | JSON,
    "max_tokens": st.integers(-5, 10**13) | JSON,
    "stream": st.booleans() | JSON,
}


@st.composite
def dialect_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"model": draw(st.sampled_from(["capped", "nope"]) | JSON),
                            "max_tokens": 2, "messages": HELLO, "input": "hi"}
    for key in draw(st.lists(st.sampled_from(DIALECT_FIELDS + ("messages",)), max_size=4,
                             unique=True)):
        body[key] = draw(DIALECT_NEAR.get(key, JSON))
    if draw(st.booleans()):
        body.pop(draw(st.sampled_from(sorted(body))))
    return body


def test_fuzz_dialect_bodies(api: Api) -> None:
    """Anthropic Messages and OpenAI Responses bodies, near-valid and not: never a 5xx, every
    Messages error in Anthropic's shape."""
    statuses: dict[int, int] = {}

    @settings(max_examples=900, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=dialect_bodies(), path=st.sampled_from(
        ["/v1/messages", "/v1/messages/count_tokens", "/v1/responses"]))
    def probe(body: dict[str, Any], path: str) -> None:
        if path == "/v1/responses":
            body.pop("messages", None)
            body.pop("max_tokens", None)
        else:
            body.pop("input", None)
        raw = json.dumps(body, allow_nan=True).encode()
        try:
            status, _, answer = api.request("POST", path, raw)
        except (BrokenPipeError, ConnectionResetError):
            status, answer = 0, b""  # header_timeout 1 s on a loaded machine (as above)
        statuses[status] = statuses.get(status, 0) + 1
        assert status < 500 or status == 529, (status, body)  # 529: an instance restarting
        if status >= 400 and path.startswith("/v1/messages"):
            assert json.loads(answer)["type"] == "error", answer
    probe()
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0, statuses
    assert statuses.get(0, 0) <= sum(statuses.values()) // 20, statuses
    assert tracebacks(api.d) == []


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens", "/v1/responses"])
def test_the_dialects_have_the_chat_endpoint_s_guards(api: Api, path: str) -> None:
    body: dict[str, Any] = {"model": "tiny", "input": "hi"}
    if "messages" in path:
        body = {"model": "tiny", "messages": HELLO}
        if not path.endswith("count_tokens"):
            body["max_tokens"] = 2
    raw = json.dumps(body).encode()
    anthropic_shape = path.startswith("/v1/messages")

    def kind(answer: bytes) -> str:
        doc = json.loads(answer)
        return doc["error"]["type"] if anthropic_shape else doc["error"]["code"]

    status, _, answer = api.request("POST", path, raw, token=None)
    assert status == 401
    assert kind(answer) == ("authentication_error" if anthropic_shape else "invalid_api_key")
    status, _, answer = api.request("POST", path, raw,
                                    headers={"Host": f"attacker.example:{api.port}"})
    assert status == 421, answer
    status, _, answer = api.request("POST", path, raw, headers={"Content-Type": "text/plain"})
    assert status == 415, answer
    status, _, answer = api.request("POST", path, b"[" * 100_000)
    assert status == 413
    assert kind(answer) == ("request_too_large" if anthropic_shape else "request_too_large")
    status, _, _ = api.request("POST", path, raw, headers={"x-api-key": TOKENS[1]}, token=None)
    assert status == 200
    assert tracebacks(api.d) == []
