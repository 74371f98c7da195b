"""`exoctl chat`: a small streaming client of exod's HTTP API, on the standard library only
(http.client), so exoctl stays fast to start. The API's address comes from the daemon's status.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import click

from exod.wire.control_status import Snapshot
from exod.core.text import clip


@dataclass
class ChatClient:
    url: str  # http://host:port
    token: str | None = None
    timeout: float | None = None  # None: no bound (a long answer on a slow model is fine)
    options: dict[str, Any] = field(default_factory=dict)

    def stream(self, model: str, messages: list[dict[str, str]]) -> Iterator[dict[str, Any]]:
        """POST /v1/chat/completions with stream: true; yield each chunk object.
        Raises click.ClickException with the API's error message."""
        parts = urlsplit(self.url)
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80,
                                          timeout=self.timeout)
        body = {"model": model, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, **self.options}
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
            resp = conn.getresponse()
            if resp.status != 200:
                raise click.ClickException(_error_text(resp.status, resp.read()))
            while True:
                line = resp.readline()
                if not line:
                    raise click.ClickException("the stream ended without [DONE]")
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                yield json.loads(data)
        except (ConnectionError, OSError) as e:
            raise click.ClickException(f"cannot reach exod's HTTP API at {self.url}: {e}") \
                from None
        finally:
            conn.close()


def _error_text(status: int, raw: bytes) -> str:
    try:
        err = json.loads(raw)["error"]
        return f"{err['message']} (HTTP {status})"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {clip(raw.decode('utf-8', 'replace'), 200)}"


def api_from_status(status: Snapshot) -> tuple[str, str | None]:
    """(url, token) from `exoctl status`'s daemon.api; the token from EXOD_API_TOKEN, else the
    configured token file when this user can read it."""
    api = status.daemon.api
    if not api:
        raise click.ClickException("exod's HTTP API is off (api.listen is empty)")
    token = os.environ.get("EXOD_API_TOKEN")
    if not token and api.token_file:
        from exod.api.token import read_token

        try:
            token = read_token(api.token_file)
        except OSError as e:
            raise click.ClickException(f"the API needs a token: set EXOD_API_TOKEN or make "
                                       f"{api.token_file} usable ({e.strerror})") from None
    return api.url, token


def answer(client: ChatClient, model: str, messages: list[dict[str, str]], as_json: bool,
           out: Callable[[str], None]) -> str:
    """Stream one answer: text to `out` as it comes (or each raw chunk with --json)."""
    text: list[str] = []
    for chunk in client.stream(model, messages):
        if "error" in chunk:
            if as_json:
                out(json.dumps(chunk) + "\n")
            raise click.ClickException(f"{chunk['error'].get('message', 'error')}")
        if as_json:
            out(json.dumps(chunk) + "\n")
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") or ""
            text.append(piece)
            if piece and not as_json:
                out(piece)
    if not as_json:
        out("\n")
    return "".join(text)


def run_chat(client: ChatClient, model: str, prompt: str | None, system: str | None,
             as_json: bool) -> None:
    def out(s: str) -> None:
        sys.stdout.write(s)
        sys.stdout.flush()

    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    if prompt is not None:
        answer(client, model, [*history, {"role": "user", "content": prompt}], as_json, out)
        return
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
        click.echo(f"chat with {model}; Ctrl-D to end", err=True)
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            if interactive:
                click.echo("", err=True)
            return
        except KeyboardInterrupt:
            click.echo("", err=True)
            return
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        try:
            reply = answer(client, model, history, as_json, out)
        except KeyboardInterrupt:  # stop this answer (closing the stream cancels it), go on
            history.pop()
            out("\n")
            continue
        history.append({"role": "assistant", "content": reply})
