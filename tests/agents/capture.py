"""A loopback HTTP server that records what a client sends and answers as the API it asked:
Messages (`POST .../messages`) and Responses (`POST .../responses`) as streams of canned events,
chat completions likewise; anything else a 404. The record of each request: method, path,
query, headers (secrets replaced by "<redacted>") and the body as JSON.

Or, given an upstream (exod), a recording proxy: what the client sent, and what exod
answered, relayed as it streams.

Canned: a model request whose tools include the agent's shell tool and that carries no tool
result yet is answered with one call of it (`echo exod-tool-ran`); any other with a fixed
text. So one session shows the agent's first request, its tool round trip and its follow-up.

Stdlib only: it must run where nothing but Python is set up.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

SECRET_HEADERS = {"authorization", "x-api-key", "cookie", "proxy-authorization"}
COMMAND = "echo exod-tool-ran"
ANSWER = "exod-capture-answer"


def _sse(events: list[tuple[str | None, dict[str, Any]]]) -> Iterator[bytes]:
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        yield f"{head}data: {json.dumps(data)}\n\n".encode()


def _has(body: Any, key: str, value: str) -> bool:
    """Whether any object nested in `body` has `key` == `value`."""
    if isinstance(body, dict):
        return body.get(key) == value or any(_has(v, key, value) for v in body.values())
    if isinstance(body, list):
        return any(_has(v, key, value) for v in body)
    return False


def _tool_names(body: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for tool in body.get("tools") or []:
        fn = tool.get("function", tool)
        if isinstance(fn, dict) and "name" in fn:
            names.add(fn["name"])
        for inner in tool.get("tools") or []:  # Responses' namespace tools
            if "name" in inner:
                names.add(f"{tool.get('name')}.{inner['name']}")
    return names


def messages_stream(body: dict[str, Any]) -> Iterator[bytes]:
    message = {"id": "msg_capture", "type": "message", "role": "assistant",
               "model": body.get("model", ""), "content": [], "stop_reason": None,
               "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 0}}
    call = "Bash" in _tool_names(body) and not _has(body.get("messages"), "type", "tool_result")
    if call:
        block: dict[str, Any] = {"type": "tool_use", "id": "toolu_capture", "name": "Bash",
                                 "input": {}}
        delta = {"type": "input_json_delta",
                 "partial_json": json.dumps({"command": COMMAND, "description": "Echo"})}
    else:
        block, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": ANSWER}
    return _sse([
        ("message_start", {"type": "message_start", "message": message}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": block}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": "tool_use" if call else "end_turn",
                                     "stop_sequence": None},
                           "usage": {"output_tokens": 1}}),
        ("message_stop", {"type": "message_stop"}),
    ])


SHELL_TOOLS = ("shell", "exec_command", "local_shell", "shell_command")


def responses_stream(body: dict[str, Any]) -> Iterator[bytes]:
    names = _tool_names(body)
    shell = next((n for n in SHELL_TOOLS if n in names), None)
    call = shell is not None and not _has(body.get("input"), "type", "function_call_output")
    if call:
        args = {"command": ["bash", "-lc", COMMAND]} if shell == "shell" else \
            {"command": COMMAND} if shell == "shell_command" else {"cmd": COMMAND}
        item: dict[str, Any] = {"type": "function_call", "id": "fc_capture",
                                "call_id": "call_capture", "name": shell,
                                "arguments": json.dumps(args), "status": "completed"}
    else:
        item = {"type": "message", "id": "msg_capture", "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": ANSWER, "annotations": []}]}
    response = {"id": "resp_capture", "object": "response", "status": "in_progress",
                "model": body.get("model", ""), "output": []}
    done = {**response, "status": "completed", "output": [item],
            "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}
    events: list[tuple[str | None, dict[str, Any]]] = [
        ("response.created", {"type": "response.created", "response": response}),
        ("response.output_item.added", {"type": "response.output_item.added",
                                        "output_index": 0, "item": {**item}}),
    ]
    if not call:
        events.append(("response.output_text.delta", {
            "type": "response.output_text.delta", "item_id": "msg_capture", "output_index": 0,
            "content_index": 0, "delta": ANSWER}))
    events += [
        ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0,
                                       "item": item}),
        ("response.completed", {"type": "response.completed", "response": done}),
    ]
    return _sse(events)


def chat_stream(body: dict[str, Any]) -> Iterator[bytes]:
    names = _tool_names(body)
    call = bool(names) and not any(m.get("role") == "tool" for m in body.get("messages", []))
    base = {"id": "chatcmpl-capture", "object": "chat.completion.chunk", "created": 0,
            "model": body.get("model", "")}
    if call:
        name = sorted(names)[0]
        delta: dict[str, Any] = {"role": "assistant", "tool_calls": [{
            "index": 0, "id": "call_capture", "type": "function",
            "function": {"name": name, "arguments": "{}"}}]}
    else:
        delta = {"role": "assistant", "content": ANSWER}
    chunks = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
              {**base, "choices": [{"index": 0, "delta": {},
                                    "finish_reason": "tool_calls" if call else "stop"}]}]
    yield from (b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    yield b"data: [DONE]\n\n"


class Recorder:
    """The exchanges seen, in order: each request as a JSON-able dict, with what was answered
    (`status`; through a proxy also `response_headers` and the `response` body as text)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def add(self, record: dict[str, Any]) -> None:
        with self.lock:
            self.requests.append(record)

    def bodies(self, path_end: str) -> list[dict[str, Any]]:
        """The JSON bodies of the requests whose path ends with `path_end`."""
        with self.lock:
            return [r["body"] for r in self.requests if r["path"].endswith(path_end)]

    def told(self, proc: Any, width: int = 400) -> str:
        """What a failed agent run shows: the agent's exit and output, and each exchange seen
        (the start of each answer, `width` characters)."""
        lines = [f"exit {proc.returncode}", f"stdout: {proc.stdout[-1500:]}",
                 f"stderr: {proc.stderr[-2500:]}"]
        for r in self.requests:
            answer = (r.get("response") or "")[:width].replace("\n", " | ")
            lines.append(f"{r['method']} {r['path']} -> {r.get('status')}: {answer}")
        return "\n".join(lines)


# Not forwarded by the proxy: hop-by-hop headers, and the ones the proxy sets itself.
_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length",
        "proxy-connection", "te", "upgrade"}


def serve(recorder: Recorder, upstream: str | None = None) -> ThreadingHTTPServer:
    """Start the server on 127.0.0.1 (a port the kernel picks) in a thread; returns it.
    `upstream` ("http://HOST:PORT"): forward every request there and relay the answer as it
    comes (streams stay streams), recording both, instead of answering with canned streams."""
    target = urlsplit(upstream) if upstream else None

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _record(self) -> tuple[dict[str, Any], bytes]:
            url = urlsplit(self.path)
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = {"<not json>": raw[:2000].decode(errors="replace")}
            headers = {k.lower(): ("<redacted>" if k.lower() in SECRET_HEADERS else v)
                       for k, v in self.headers.items()}
            record = {"method": self.command, "path": url.path,
                      "query": dict(parse_qsl(url.query, keep_blank_values=True)),
                      "headers": headers, "body": body}
            recorder.add(record)
            return record, raw

        def _send(self, status: int, chunks: Iterator[bytes], kind: str,
                  record: dict[str, Any]) -> None:
            record["status"] = status
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("cache-control", "no-cache")
            self.send_header("connection", "close")
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(chunk)
            self.wfile.flush()
            self.close_connection = True

        def _forward(self, record: dict[str, Any], raw: bytes) -> None:
            assert target is not None and target.hostname and target.port
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=600)
            try:
                conn.request(self.command, self.path, body=raw or None, headers={
                    k: v for k, v in self.headers.items() if k.lower() not in _HOP})
                resp = conn.getresponse()
                record["status"] = resp.status
                record["response_headers"] = {k.lower(): v for k, v in resp.getheaders()}
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP:
                        self.send_header(k, v)
                self.send_header("connection", "close")  # the body ends where the stream does
                self.end_headers()
                got = bytearray()
                while chunk := resp.read1(65536):
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    got += chunk
                record["response"] = got.decode(errors="replace")
            finally:
                conn.close()
            self.close_connection = True

        def _answer(self) -> None:
            record, raw = self._record()
            if target is not None:
                self._forward(record, raw)
                return
            body = record["body"] if isinstance(record["body"], dict) else {}
            path = record["path"]
            if self.command == "POST" and path.endswith("/messages"):
                self._send(200, messages_stream(body), "text/event-stream", record)
            elif self.command == "POST" and path.endswith("/responses"):
                self._send(200, responses_stream(body), "text/event-stream", record)
            elif self.command == "POST" and path.endswith("/chat/completions"):
                self._send(200, chat_stream(body), "text/event-stream", record)
            else:
                err = json.dumps({"error": {"message": f"no {path} here"}}).encode()
                self._send(404, iter([err]), "application/json", record)

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


PROMPT = "Run `echo exod-tool-ran` in the shell, then tell me what it printed."


def capture(agent: str, work: Path, prompt: str = PROMPT) -> dict[str, Any]:
    """Run `agent` (a name in tests.agents.clients.RUNS) once against a capture server: what
    it sent, with its version and exit status."""
    from tests.agents import clients

    recorder = Recorder()
    server = serve(recorder)
    try:
        home, cwd = work / "home", work / "cwd"
        home.mkdir(parents=True, exist_ok=True)
        cwd.mkdir(parents=True, exist_ok=True)
        base_url = f"http://127.0.0.1:{server.server_address[1]}"
        run = clients.RUNS[agent](base_url, "exod-test", prompt, home, cwd)
        proc = run(timeout=300)
    finally:
        server.shutdown()
    return {"agent": agent, "version": clients.version(run.argv[0]), "prompt": prompt,
            "exit": proc.returncode, "stdout": proc.stdout[-2000:],
            "requests": recorder.requests}


def main() -> None:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="Record what an agent sends (loopback only).")
    parser.add_argument("agent")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        record = capture(args.agent, Path(work))
    args.out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    for r in record["requests"]:
        print(r["method"], r["path"], r["query"] or "", len(json.dumps(r["body"])), "bytes")
    print(f"{record['version']}: exit {record['exit']}")


if __name__ == "__main__":
    main()
