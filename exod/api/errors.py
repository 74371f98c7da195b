"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, with the status.

The same object, sent as an SSE `data:` line, ends a stream that fails after it has started
(the official clients raise an APIError on it).
"""

from __future__ import annotations

from typing import Any

from exod.wire import messages as m
from exod.api import window_errors

RETRY_AFTER_S = 5  # a hint for clients of an instance that is loading, stopping or restarting


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str, code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param
        self.headers = headers or {}
        # The message in another dialect's own words, where its clients look for them
        # (exod.api.window_errors); a dialect not named here says `message`.
        self.in_dialect: dict[str, str] = {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.code, self.param)

    def said(self, dialect: str) -> str:
        """The message as `dialect` ("anthropic", "ollama") words it."""
        return self.in_dialect.get(dialect, self.message)


def error_body(message: str, type_: str, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", code, param)


def window_exceeded(words: window_errors.Words, param: str | None) -> ApiError:
    """A prompt past the context window: OpenAI's 400 and code, in each dialect's words."""
    err = ApiError(400, words.openai, "invalid_request_error", window_errors.CODE, param)
    err.in_dialect.update(anthropic=words.anthropic, ollama=words.ollama)
    return err


# Clients' SDKs (openai, anthropic) and agents read this header before their own retry rules: a
# wrong key or a missing scope is not cured by asking again (Claude Code otherwise retries a 401
# ten times over minutes before it says the key is wrong).
NO_RETRY = {"x-should-retry": "false"}


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, "invalid_request_error", "invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer", **NO_RETRY})


def model_not_found(name: str) -> ApiError:
    return ApiError(404, f"The model `{name}` does not exist: it names no exod instance.",
                    "invalid_request_error", "model_not_found", "model")


def not_ready(name: str, detail: str, stopping: bool = False) -> ApiError:
    code = "model_stopping" if stopping else "model_not_ready"
    return ApiError(503, f"The model `{name}` is not ready ({detail}).",
                    "service_unavailable_error", code,
                    headers={"Retry-After": str(RETRY_AFTER_S)})


def served_elsewhere(name: str, host: str) -> ApiError:
    """A multi-host instance is served by the daemon that runs its rank 0."""
    return ApiError(503, f"The model `{name}` is served by exod on host {host!r} (its rank 0 "
                         "runs there); send the request to that host.",
                    "service_unavailable_error", "served_elsewhere")


def serves_other(name: str, serves: str) -> ApiError:
    """A request for a kind of work the instance's model does not do (`serves`: its role,
    exod.facts.embed)."""
    from exod.facts.embed import ENDPOINTS, Role

    role: Role = "embed" if serves == "embed" else "rerank" if serves == "rerank" else "chat"
    return ApiError(400, f"The model `{name}` serves {ENDPOINTS[role]}: send this request to "
                         "an instance of a model that does this.", "invalid_request_error",
                    "wrong_model_kind", "model")


def queue_full(name: str, limit: int, queue: int) -> ApiError:
    return ApiError(429, f"The model `{name}` is busy: {limit} request(s) running and {queue} "
                         "waiting, the most it takes. Retry later.",
                    "rate_limit_error", "queue_full", headers={"Retry-After": "1"})


def runner_error(ev: m.Error) -> ApiError:
    """A generation that failed in (or with) the runner, after it was accepted; its `param`:
    the field the runner found at fault (checked there against the model as loaded). A prompt
    past the context window becomes the error each dialect's clients act on."""
    code, message, param = ev.code, ev.message, ev.param
    words = window_errors.from_runner(ev)
    if words is not None:
        return window_exceeded(words, param)
    if code in ("bad_request", "context_length_exceeded"):
        return bad_request(message, param)
    if code == "key_revoked":
        return unauthorized(message)
    if code in ("aborted", "stopping", "runner_gone", "hung"):
        return ApiError(503, message, "service_unavailable_error", code,
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    return ApiError(500, message, "server_error", code)
