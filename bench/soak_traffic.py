"""The soak's traffic (bench.soak): every kind of request exod serves, each read to its end and
put in one of four outcomes, so that a lost request cannot hide among the answered ones.

- answered: a 2xx whose body is whole (a JSON object; a stream that reached its dialect's last
  event: `[DONE]`, `message_stop`, `response.completed`, Ollama's `"done": true`);
- refused: a status or a stream event that says why (an error with a message), as clients
  handle it;
- left: the client left mid-stream on purpose;
- lost: anything else. A connection reset after the request was sent, a stream that stops
  without its last event, an error without a reason, no answer within `TIMEOUT`.

A connection the kernel refuses (the daemon is being restarted) never carried the request: it
is tried again a moment later, as the SDKs do, and counted apart. Each request has a connection
of its own, so that a keep-alive connection the server closed while idle is never mistaken for
a lost request.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

TIMEOUT = 300.0  # seconds without a byte before a request counts as lost
RETRY_CONNECT = 0.5  # seconds before a refused connection is tried again

TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
SCHEMA = {"type": "object", "properties": {"tags": {"type": "array", "maxItems": 4,
                                                     "items": {"type": "string",
                                                               "maxLength": 12}}},
          "required": ["tags"], "additionalProperties": False}
WORDS = ("river stone cloud lantern orchard copper meadow signal harbor thistle ember quartz "
         "willow canyon beacon saffron glacier pepper marble falcon").split()


def prefix(n: int, words: int = 300) -> str:
    """One of four long system prompts (~600 tokens each): what agents' sessions share, and
    what the disk tier must give back after a restart."""
    return f"Prefix {n}: " + " ".join(WORDS[(i * 7 + n) % len(WORDS)] for i in range(words))


@dataclass(frozen=True)
class Ask:
    kind: str
    path: str
    body: dict[str, Any]
    stream: str = ""  # the dialect's stream: chat, messages, responses, ollama; "" when whole
    leave: bool = False


@dataclass(frozen=True)
class Names:
    """The soak's instances: `chat` takes runner chaos; `steady` never does (its runner lives
    for a daemon's whole life); `eye` sees, and takes runner chaos, `steady_eye` sees and never
    does; `vec` embeds; `rank` reranks."""

    chat: str = "soak"
    steady: str = "steady"
    eye: str = "eye"
    steady_eye: str = "eye-steady"
    vec: str = "vec"
    rank: str = "rank"


def _user(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Request {i}: tell me about {i % 97} cats."}]


def _picture(url: str, i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": f"What is in picture {i}?"}]}]


def mix(i: int, n: Names, data_url: str, fetch_url: str) -> Ask:
    """The i-th request: eighteen kinds in turn."""
    base: dict[str, Any] = {"model": n.chat, "max_tokens": 24, "temperature": 0.7, "seed": i}
    eye = n.eye if (i // 18) % 2 else n.steady_eye  # pictures to each in turn, round by round
    kinds: list[Ask] = [
        Ask("chat", "/v1/chat/completions", {**base, "messages": _user(i)}),
        Ask("chat stream", "/v1/chat/completions", {
            **base, "messages": _user(i), "stream": True,
            "stream_options": {"include_usage": True}}, "chat"),
        Ask("forced tool", "/v1/chat/completions", {
            **base, "messages": _user(i), "tools": [TOOL], "tool_choice": "required",
            "max_tokens": 64}),
        Ask("json_schema", "/v1/chat/completions", {
            **base, "messages": _user(i), "max_tokens": 64, "response_format": {
                "type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}}),
        Ask("messages stream", "/v1/messages", {
            "model": n.chat, "max_tokens": 24, "stream": True,
            "system": [{"type": "text", "text": "Be brief.",
                        "cache_control": {"type": "ephemeral"}}],
            "messages": _user(i)}, "messages"),
        Ask("responses stream", "/v1/responses", {
            "model": n.steady, "max_output_tokens": 24, "stream": True,
            "instructions": "Be brief.", "input": f"Question {i}"}, "responses"),
        Ask("completions", "/v1/completions", {**base, "model": n.steady,
                                               "prompt": f"Once upon a time {i}"}),
        Ask("ollama chat", "/api/chat", {
            "model": n.steady, "messages": _user(i), "options": {"num_predict": 24, "seed": i}},
            "ollama"),
        Ask("ollama generate", "/api/generate", {
            "model": n.steady, "prompt": f"Say {i}", "stream": False,
            "options": {"num_predict": 24, "seed": i}}),
        Ask("picture (data)", "/v1/chat/completions", {
            **base, "model": eye, "max_tokens": 12, "messages": _picture(data_url, i)}),
        Ask("picture (fetched)", "/v1/chat/completions", {
            **base, "model": eye, "max_tokens": 12, "stream": True,
            "messages": _picture(f"{fetch_url}?i={i}", i)}, "chat"),
        Ask("embeddings", "/v1/embeddings", {
            "model": n.vec, "input": [f"text {i} {w}" for w in WORDS[: 1 + i % 8]]}),
        Ask("ollama embed", "/api/embed", {"model": n.vec, "input": f"one text {i}"}),
        Ask("rerank", "/v1/rerank", {"model": n.rank, "query": f"which {i}?",
                                     "documents": [f"doc {i} {w}" for w in WORDS[:6]]}),
        Ask("shared prefix", "/v1/chat/completions", {
            **base, "max_tokens": 8, "messages": [
                {"role": "system", "content": prefix(i % 4)}, *_user(i)]}),
        Ask("refused: field", "/v1/chat/completions", {**base, "messages": _user(i),
                                                        "temperature": 9}),
        Ask("refused: model", "/v1/chat/completions", {**base, "model": f"nobody-{i}",
                                                        "messages": _user(i)}),
        Ask("client leaves", "/v1/chat/completions", {
            **base, "messages": _user(i), "stream": True, "max_tokens": 200}, "chat",
            leave=True),
    ]
    return kinds[i % len(kinds)]


# ---- reading an answer ------------------------------------------------------------------------
def reason(obj: Any) -> str | None:
    """The message of an error object in any dialect, else None."""
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if isinstance(err, str) and err:
        return err  # Ollama's
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])  # OpenAI's, Anthropic's
    if obj.get("type") in ("error", "response.failed"):
        said = obj.get("message") or (obj.get("response") or {}).get("error", {}).get("message")
        return str(said) if said else None
    return None


def last_event(dialect: str, obj: Any, raw: str) -> bool:
    if dialect == "chat":
        return raw == "[DONE]"
    if not isinstance(obj, dict):
        return False
    if dialect == "messages":
        return obj.get("type") == "message_stop"
    if dialect == "responses":
        return obj.get("type") in ("response.completed", "response.incomplete")
    return obj.get("done") is True  # ollama


def payloads(dialect: str, r: httpx.Response) -> Any:
    """(raw, parsed) of each event of a stream: SSE `data:` lines, or NDJSON lines."""
    for line in r.iter_lines():
        if dialect != "ollama":
            if not line.startswith("data:"):
                continue
            line = line[5:].strip()
        elif not line.strip():
            continue
        try:
            yield line, json.loads(line)
        except ValueError:
            yield line, None


@dataclass
class Outcome:
    what: str  # answered, refused, left, lost
    detail: str = ""


def read(r: httpx.Response, ask: Ask) -> Outcome:
    if not ask.stream or r.status_code >= 400:
        r.read()
        try:
            obj = r.json()
        except ValueError:
            return Outcome("lost", f"{r.status_code} without a JSON body: {r.text[:120]!r}")
        why = reason(obj)
        if r.status_code >= 400:
            return Outcome("refused", f"{r.status_code} {why}") if why else \
                Outcome("lost", f"{r.status_code} without a reason: {r.text[:120]!r}")
        if why or not isinstance(obj, dict):
            return Outcome("lost", f"{r.status_code} with {r.text[:120]!r}")
        return Outcome("answered")
    for n, (raw, obj) in enumerate(payloads(ask.stream, r)):
        if ask.leave and n == 3:
            return Outcome("left")  # the connection closes as the `with` ends
        why = reason(obj)
        if why:
            return Outcome("refused", f"in the stream: {why}")
        if last_event(ask.stream, obj, raw):
            return Outcome("answered")
    return Outcome("lost", "the stream ended without its last event")


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    by_kind: dict[str, Counter[str]] = field(default_factory=dict)
    reasons: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)  # the first few, with what happened
    reconnects: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, ask: Ask, out: Outcome) -> None:
        with self.lock:
            self.outcomes[out.what] += 1
            self.by_kind.setdefault(ask.kind, Counter())[out.what] += 1
            if out.what == "refused":
                self.reasons[_shape(out.detail)] += 1
            if out.what == "lost" and len(self.lost) < 20:
                self.lost.append(f"{time.strftime('%H:%M:%S')} {ask.kind}: {out.detail}")

    @property
    def done(self) -> int:
        return sum(self.outcomes.values())


def _shape(detail: str) -> str:
    """A refusal's reason without its numbers, so that alike reasons count together."""
    return "".join("#" if c.isdigit() else c for c in detail)[:110]


class Load:
    """`clients` threads, each sending the mix in turn until `stop`."""

    def __init__(self, url: str, names: Names, data_url: str, fetch_url: str) -> None:
        self.url, self.names = url, names
        self.data_url, self.fetch_url = data_url, fetch_url
        self.stop = threading.Event()
        self.tally = Tally()

    def client(self, c: int, clients: int) -> None:
        i = c
        limits = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=self.url, timeout=TIMEOUT, limits=limits) as http:
            while not self.stop.is_set():
                ask = mix(i, self.names, self.data_url, self.fetch_url)
                self.tally.add(ask, self.one(http, ask))
                i += clients

    def one(self, http: httpx.Client, ask: Ask) -> Outcome:
        while True:
            try:
                with http.stream("POST", ask.path, json=ask.body) as r:
                    return read(r, ask)
            except httpx.ConnectError:
                with self.tally.lock:
                    self.tally.reconnects += 1
                if self.stop.wait(RETRY_CONNECT):
                    return Outcome("refused", "the soak ended while the daemon was down")
            except httpx.HTTPError as e:
                return Outcome("lost", f"{type(e).__name__}: {e}")


# ---- a picture server on an allowed address ---------------------------------------------------
class PictureServer:
    """A picture at http://HOST:PORT/p.png (HOST a loopback address the config allows, as an
    operator allows an image server on the LAN)."""

    def __init__(self, host: str, png: bytes) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(png)))
                self.end_headers()
                self.wfile.write(png)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}/p.png"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
