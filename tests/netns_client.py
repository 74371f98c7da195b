"""A client of the HTTP API run inside a test host's network namespace (the test itself runs
outside it), driven by one JSON line a command on stdin, answering one JSON line each:

    {"op": "post", "url": U, "body": B, "headers": H}  -> {"status", "headers", "body"}
    {"op": "get", "url": U, "headers": H}              -> the same
    {"op": "stream", "base": V1_URL, "key": K, "body": B}
        openai's client with stream=True: {"first": TEXT} once the first text chunk is read,
        then it reads the next command: "close" closes the stream ({"closed": true}), "rest"
        reads it to its end ({"text": WHOLE TEXT}, or {"error": WHAT, "text"} when it breaks)

    python -m tests.netns_client
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from typing import Any


def say(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def http(op: dict[str, Any]) -> dict[str, Any]:
    data = None if op["op"] == "get" else json.dumps(op["body"]).encode()
    req = urllib.request.Request(op["url"], data=data, method="GET" if data is None else "POST",
                                 headers={"Content-Type": "application/json",
                                          **op.get("headers", {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return {"status": r.status, "headers": dict(r.headers), "body": r.read().decode()}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "headers": dict(e.headers), "body": e.read().decode()}


def stream(op: dict[str, Any]) -> None:
    import openai

    c = openai.OpenAI(base_url=op["base"], api_key=op["key"], max_retries=0, timeout=120)
    s = c.chat.completions.create(stream=True, **op["body"])
    text = ""
    for chunk in s:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
            break
    say({"first": text})
    if sys.stdin.readline().strip() == "close":
        s.close()
        say({"closed": True})
        return
    try:
        for chunk in s:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
    except Exception as e:  # noqa: BLE001 -- what the test checks: the answer was cut
        say({"error": type(e).__name__, "text": text})
        return
    say({"text": text})


def main() -> None:
    for line in sys.stdin:
        op = json.loads(line)
        if op["op"] == "stream":
            stream(op)
        else:
            say(http(op))


if __name__ == "__main__":
    main()
