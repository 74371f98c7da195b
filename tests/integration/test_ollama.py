"""Ollama's API on exod's own listener, driven by the official `ollama` client (and raw HTTP
where the wire itself is under test), against one daemon of real runners: the tiny model
(with aliases), the agent model (a tool round trip with no steering), the thinking model, a
tiny model that sees (a picture, as mlx-vlm takes it), an on-demand instance with keep_alive
bounds, and a hub model fetched from the local hub double
(tests/hub.py: olah behind a throttle). The daemon listens on two addresses, as an operator
adds Ollama's port beside exod's.

Cost: about 30 CPU-seconds on this 2-core machine (five runners of tiny models, olah, the
fetcher three times, ~300 fuzzed bodies).
"""

from __future__ import annotations

import http.client
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import ollama
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness import Daemon
from tests.integration.test_security import tracebacks
from tests.integration.test_vision_runner import FAMILY, PROMPT, picture_png, reference
from tests.hub import Hub, Throttle, serving
from tests.models.added_tokens import copy_with_tokens
from tests.models.agent import AFTER, TRIGGER, make_agent_model
from tests.models.thinking import make_thinking_model
from tests.models.tiny import with_tool_template

TOKEN = "ollama-secret"
HELLO = [{"role": "user", "content": "hello"}]
GREEDY = {"temperature": 0, "num_predict": 12}
FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")  # Qwen2.5-Coder's
COOPERATIVE = {"EXOD_DOUBLE": "cooperative"}  # a runner that loads nothing (the hub model)
FLOOR = 3.0  # the on-demand instance's keep_alive floor, seconds
ECHO = {"type": "function", "function": {
    "name": "echo", "description": "Echo text back.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                   "required": ["text"]}}}
SCHEMA = {"type": "object", "properties": {
    "ok": {"type": "boolean"}, "kind": {"enum": ["a", "b", "c"]},
    "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3}},
    "required": ["ok", "kind", "tags"], "additionalProperties": False}


class Served:
    def __init__(self, d: Daemon, config: dict[str, Any], hub: Hub, throttle: Throttle,
                 commits: dict[str, str], cache: Path) -> None:
        self.d, self.config, self.hub, self.throttle, self.commits, self.cache = \
            d, config, hub, throttle, commits, cache
        self.urls: list[str] = d.status()["daemon"]["api"]["urls"]
        self.url = self.urls[1]  # the second address: "Ollama's port"
        self.client = self.at(self.url)

    @staticmethod
    def at(url: str, token: str | None = TOKEN) -> ollama.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return ollama.Client(host=url, headers=headers, timeout=120)

    def raw(self, method: str, path: str, body: Any = None, token: str | None = TOKEN,
            headers: dict[str, str] | None = None, timeout: float = 60
            ) -> tuple[int, dict[str, str], bytes]:
        parts = urlsplit(self.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        h = {"Content-Type": "application/json", **(headers or {})}
        if token:
            h["Authorization"] = f"Bearer {token}"
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, data, h)
        resp = conn.getresponse()
        out = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        conn.close()
        return out


@pytest.fixture(scope="module")
def served(tiny_model: Path, tiny_model_factory: Callable[..., Path], vision_zoo: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("ollama")
    (tmp / "token").write_text(TOKEN + "\n")
    (tmp / "token").chmod(0o600)  # a secret: closed to other users
    agent = make_agent_model(with_tool_template(tiny_model, tmp / "tools"), tmp / "agent")
    think = make_thinking_model(tiny_model, tmp / "think")
    coder = tmp / "coder"  # a tiny model with fill-in-the-middle tokens
    copy_with_tokens(tiny_model, coder, FIM)
    cache = tmp / "cache"
    with serving(tmp / "hub", tiny_model_factory) as (hub, throttle, commits):
        config: dict[str, Any] = {"api": {"listen": ["127.0.0.1:0", "127.0.0.1:0"],
                            "token_file": str(tmp / "token")},
                    "hub": {"cache": str(cache), "stall_after": "30s"},
                    "instances": {
                        "tiny": {"model": str(tiny_model), "aliases": ["llama3.2", "qwen3:8b"]},
                        "capped": {"model": str(tiny_model), "max_tokens_cap": 6},
                        "agent": {"model": str(agent)},
                        "think": {"model": str(think)},
                        "coder": {"model": str(coder), "autostart": "on-demand"},
                        "od": {"model": str(tiny_model), "autostart": "on-demand",
                               "idle_stop_after": "10m",
                               "keep_alive": {"min": f"{FLOOR:g}s", "max": "1h"}},
                        "hubbed": {"model": "hf:org/tiny", "env": COOPERATIVE},
                        "sees": {"model": str(vision_zoo / FAMILY), "autostart": "on-demand"}}}
        d = Daemon(config, env={"HF_ENDPOINT": throttle.url}, name="ollama")
        try:
            d.start()
            d.watch_until(lambda s: all(i["state"] == "ready" for i in s["instances"]
                                        if i["name"] not in ("od", "sees", "coder")),
                          what="every instance ready")
            yield Served(d, config, hub, throttle, commits, cache)
        finally:
            d.close()


# ---- what Ollama's clients probe ------------------------------------------------------------
def test_root_version_auth_and_both_addresses(served: Served) -> None:
    for url in served.urls:  # api.listen's two addresses serve alike
        assert served.at(url).list().models
    status, headers, body = served.raw("GET", "/", token=None)
    assert (status, body) == (200, b"Ollama is running")  # what clients probe, no token
    status, headers, body = served.raw("HEAD", "/", token=None)
    assert status == 200 and body == b""
    status, headers, body = served.raw("GET", "/", token=None,
                                       headers={"Accept": "text/html,*/*"})
    assert status == 200 and headers["content-type"].startswith("text/html")  # a browser
    status, _, body = served.raw("GET", "/api/version")
    version = json.loads(body)["version"]
    # Copilot parses each part as an integer and wants at least 0.6.4.
    assert [int(p) for p in version.split(".")] >= [0, 6, 4]
    with pytest.raises(ollama.ResponseError) as e:
        served.at(served.url, token=None).list()
    assert e.value.status_code == 401 and "token" in str(e.value.error)
    status, _, body = served.raw("GET", "/api/nope")
    assert status == 404 and isinstance(json.loads(body)["error"], str)


def test_tags_and_v1_models_list_the_same_instances(served: Served) -> None:
    tags = {m.model: m for m in served.client.list().models}
    v1 = openai.OpenAI(base_url=served.url + "/v1", api_key=TOKEN, max_retries=0)
    assert set(tags) == {m.id for m in v1.models.list().data}
    tiny = tags["tiny"]
    assert tiny.size and tiny.size > 3_000_000 and len(tiny.digest or "") == 64
    assert tiny.modified_at is not None and tiny.modified_at.year > 2000
    details = tiny.details
    assert details is not None and (details.family, details.format, details.quantization_level,
                                    details.parameter_size) == ("llama", "safetensors", "F32",
                                                                "853K")
    assert tags["capped"].digest == tiny.digest  # the same files
    assert tags["hubbed"].size and tags["hubbed"].digest != tiny.digest  # its snapshot


def test_show_has_what_copilot_reads_under_every_name(served: Served) -> None:
    for name in ("tiny", "tiny:latest", "llama3.2", "llama3.2:latest", "qwen3:8b"):
        shown = served.client.show(name)
        info = shown.modelinfo or {}
        assert info["general.architecture"] == "llama"
        assert info["llama.context_length"] == 131072
        assert shown.capabilities == ["completion"]
        assert "<|im_start|>" in (shown.template or "")
    assert "tools" in (served.client.show("agent").capabilities or [])
    assert "thinking" in (served.client.show("think").capabilities or [])
    for name in ("nope", "qwen3", "qwen3:4b"):  # an alias answers to its own tag only
        with pytest.raises(ollama.ResponseError) as e:
            served.client.show(name)
        assert e.value.status_code == 404


def test_a_reload_that_changes_only_aliases_restarts_nothing(served: Served) -> None:
    before = served.d.instance("tiny")["ranks"][0]["pid"]
    config = json.loads(json.dumps(served.config))
    config["instances"]["tiny"]["aliases"] = ["llama3.2", "qwen3:8b", "mistral:7b"]
    served.d.write_config({"control": {"socket": str(served.d.socket)}, **config})
    try:
        served.d.ctl("reload")
        assert served.client.show("mistral:7b").capabilities == ["completion"]
        assert served.d.instance("tiny")["ranks"][0]["pid"] == before  # still serving
    finally:
        served.d.write_config({"control": {"socket": str(served.d.socket)}, **served.config})
        served.d.ctl("reload")
    with pytest.raises(ollama.ResponseError):
        served.client.show("mistral:7b")


def test_copilot_posts_chat_completions_and_raycast_appends_a_tag(served: Served) -> None:
    """Copilot lists models from /api/tags, then POSTs /v1/chat/completions to the same host
    and port; Raycast sends `name:latest`."""
    (name,) = [m.model for m in served.client.list().models if m.model == "tiny"]
    v1 = openai.OpenAI(base_url=served.url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)
    r = v1.chat.completions.create(model=name or "", messages=HELLO,  # type: ignore[arg-type]
                                   max_tokens=12, temperature=0)
    raycast = served.client.chat(model="tiny:latest", messages=HELLO, options=GREEDY)
    alias = served.client.chat(model="llama3.2:latest", messages=HELLO, options=GREEDY)
    assert raycast.message.content == alias.message.content == r.choices[0].message.content
    assert raycast.model == "tiny:latest"  # the name the client sent, as Ollama answers


# ---- generation -------------------------------------------------------------------------------
def test_a_stream_is_the_whole_answer_with_ollamas_statistics(served: Served) -> None:
    whole = served.client.chat(model="tiny", messages=HELLO, options=GREEDY, stream=False)
    parts = list(served.client.chat(model="tiny", messages=HELLO, options=GREEDY, stream=True))
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done
    for final in (whole, parts[-1]):
        assert final.done_reason == "length" and final.eval_count == 12
        assert (final.prompt_eval_count or 0) > 0
        assert (final.total_duration or 0) >= (final.eval_duration or 0) > 0  # nanoseconds
        assert (final.total_duration or 0) < 60 * 10**9
    gen = served.client.generate(model="tiny", prompt="hello", options=GREEDY)
    streamed = list(served.client.generate(model="tiny", prompt="hello", options=GREEDY,
                                           stream=True))
    assert "".join(p.response or "" for p in streamed) == gen.response
    # /api/generate without `raw` is the prompt as a user turn: the chat's answer.
    assert gen.response == whole.message.content
    raw = served.client.generate(model="tiny", prompt="hello", raw=True, options=GREEDY)
    own = served.client.generate(model="tiny", prompt="ell", system="h", options=GREEDY,
                                 template="{{ .System }}{{ .Prompt }}o")
    assert own.response == raw.response and own.prompt_eval_count == raw.prompt_eval_count


def test_sampling_options_reach_the_runner(served: Served) -> None:
    """`options` as Ollama's clients send them: a seed reproduces a sampled answer (and another
    seed changes it, with every sampler and penalty on), `stop` ends the greedy answer where its
    text begins."""
    opts = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "min_p": 0.01,
            "repeat_penalty": 1.2, "repeat_last_n": 16, "presence_penalty": 0.5,
            "frequency_penalty": 0.5, "num_predict": 16}
    one, again, other = (served.client.chat(model="tiny", messages=HELLO,
                                            options={**opts, "seed": seed}).message.content
                         for seed in (7, 7, 8))
    assert one and one == again and one != other
    whole = served.client.chat(model="tiny", messages=HELLO, options=GREEDY).message.content
    assert whole and len(whole) > 6
    cut = whole[len(whole) // 2:len(whole) // 2 + 3]
    stopped = served.client.chat(model="tiny", messages=HELLO, options={**GREEDY, "stop": [cut]})
    assert stopped.done_reason == "stop"
    assert stopped.message.content == whole[:whole.index(cut)]


def test_a_json_schema_format_is_valid_on_random_weights(served: Served) -> None:
    r = served.client.chat(model="tiny", messages=HELLO, format=SCHEMA,
                           options={"temperature": 0, "num_predict": 120})
    jsonschema.validate(json.loads(r.message.content or ""), SCHEMA)
    g = served.client.generate(model="tiny", prompt="hello", format=SCHEMA, raw=True,
                               options={"temperature": 0.7, "seed": 5, "num_predict": 120})
    jsonschema.validate(json.loads(g.response), SCHEMA)
    # "json": any object, whose free keys a random model may not close within the length
    free = served.client.generate(model="tiny", prompt="hello", format="json",
                                  options={"num_predict": 8})
    assert free.response.startswith("{")


def test_a_tool_round_trip_reaches_the_prompt(served: Served) -> None:
    """The agent model calls `echo` when asked, and answers once its result is in the prompt:
    the call comes back with its arguments as an object, and the result sent back as Ollama's
    clients send it (`tool_name`, no id) reaches the template."""
    ask = [{"role": "user", "content": f"run it: {TRIGGER}"}]
    first = served.client.chat(model="agent", messages=ask, tools=[ECHO], stream=False)
    (call,) = first.message.tool_calls or []
    assert (call.function.name, dict(call.function.arguments)) == ("echo", {"text": TRIGGER})
    streamed = list(served.client.chat(model="agent", messages=ask, tools=[ECHO], stream=True))
    calls = [c for p in streamed for c in p.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("echo", {"text": TRIGGER})]
    after = served.client.chat(model="agent", tools=[ECHO], stream=False, messages=[
        *ask, first.message, {"role": "tool", "content": TRIGGER, "tool_name": "echo"}])
    assert after.message.content == AFTER and not after.message.tool_calls


def test_think_and_what_a_model_cannot_do_are_answered_by_name(served: Served) -> None:
    thought = served.client.chat(model="think", messages=HELLO, think=True,
                                 options={"temperature": 0, "num_predict": 8})
    assert thought.message.thinking
    plain = served.client.chat(model="think", messages=HELLO, think=False,
                               options={"temperature": 0, "num_predict": 8})
    assert not plain.message.thinking and plain.message.content
    for call, needle in (
            (lambda: served.client.chat(model="tiny", messages=HELLO, think=True),
             '"tiny" does not support thinking'),
            (lambda: served.client.generate(model="tiny", prompt="a", suffix="b"),
             "`suffix`: 'tiny' has no fill-in-the-middle tokens"),
            (lambda: served.client.chat(model="tiny", messages=HELLO,
                                        options={"mirostat": 1}), "`options.mirostat`"),
            (lambda: served.client.chat(model="tiny", messages=HELLO,
                                        options={"num_ctx": 4}), "`options.num_ctx` of 4"),
            (lambda: served.client.embed(model="tiny", input="x"),
             "The model `tiny` serves chat"),  # an embedding model's instance answers it
            (lambda: served.client.embeddings(model="tiny", prompt="x"),
             "The model `tiny` serves chat"),
            (lambda: served.client.chat(model="tiny", messages=[
                {"role": "user", "content": "what is it?", "images": [b"GIF89a..."]}]),
             "`messages[0].images[0]`: this model does not see images"),
            (lambda: served.client.chat(model="nope", messages=HELLO), "`nope`")):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code in (400, 404) and needle in str(e.value.error), e.value


def test_a_suffix_fills_in_the_middle_in_the_models_own_tokens(served: Served) -> None:
    """`suffix` on a model whose vocabulary has fill-in-the-middle tokens: the runner gets the
    prompt in them (prefix, suffix, middle), as the same text sent `raw` shows."""
    assert "insert" in (served.client.show("coder").capabilities or [])
    prefix, suffix = "def f(", "):\n    return x"
    filled = served.client.generate(model="coder", prompt=prefix, suffix=suffix, options=GREEDY)
    raw = served.client.generate(model="coder", raw=True, options=GREEDY,
                                 prompt=f"{FIM[0]}{prefix}{FIM[1]}{suffix}{FIM[2]}")
    assert filled.response and filled.response == raw.response
    assert filled.prompt_eval_count == raw.prompt_eval_count
    # Each marker is one token: the prompt is its pieces' tokens and the three markers.
    pieces = [served.client.generate(model="coder", raw=True, prompt=p,
                                     options={"num_predict": 1}).prompt_eval_count or 0
              for p in (prefix, suffix)]
    assert filled.prompt_eval_count == sum(pieces) + 3


def test_a_picture_reaches_a_model_that_sees_as_mlx_vlm_takes_it(served: Served,
                                                                 vision_zoo: Path) -> None:
    want = reference(vision_zoo)  # mlx-vlm's own greedy answer, in a process of its own
    assert "vision" in (served.client.show("sees").capabilities or [])
    r = served.client.chat(model="sees", messages=[
        {"role": "user", "content": PROMPT, "images": [picture_png()]}],
        options={"temperature": 0, "num_predict": 8})
    assert r.message.content == want["text"]
    assert (r.prompt_eval_count, r.eval_count) == (want["prompt_tokens"], 8)


# ---- keep_alive -------------------------------------------------------------------------------
def test_keep_alive_sets_the_idle_stop_within_its_floor_and_ceiling(served: Served) -> None:
    def expires() -> float:
        (m,) = [m for m in served.client.ps().models if m.model == "od"]
        assert m.expires_at is not None
        return m.expires_at.timestamp() - time.time()

    loaded = served.client.generate(model="od", keep_alive="10m")  # nothing to generate: load
    assert loaded.done_reason == "load" and served.d.instance("od")["state"] == "ready"
    assert 590 < expires() <= 600
    served.client.chat(model="od", messages=HELLO, options=GREEDY, keep_alive=-1)
    assert 3590 < expires() <= 3600  # -1 (keep) within the ceiling, 1h
    asked = time.monotonic()
    gone = served.client.generate(model="od", keep_alive=0)
    assert gone.done_reason == "unload"
    assert served.d.instance("od")["state"] == "ready"  # not before the floor
    served.d.until_state("od", "stopped", timeout=60)
    assert time.monotonic() - asked >= FLOOR
    assert "od" not in {m.model for m in served.client.ps().models}
    kept = served.client.generate(model="tiny", keep_alive=0)  # always on: it stays
    assert kept.done_reason == "load" and served.d.instance("tiny")["state"] == "ready"


# ---- the cache: pull, list, delete ------------------------------------------------------------
def test_a_pull_resumes_after_a_stop_and_a_delete_spares_what_runs(served: Served) -> None:
    throttle, v1 = served.throttle, served.commits["v1"]
    name = f"hf.co/org/tiny:{v1}"  # the older commit: not in the cache yet
    throttle.rate = 300_000  # ~12 s for the model: the pull is stopped midway
    try:
        stream = served.client.pull(name, stream=True)
        seen = []
        for p in stream:
            seen.append(p.status)
            if (p.completed or 0) > 1_000_000:
                break
        stream.close()  # the client goes away: the fetcher stops, its partial file stays
        assert seen[0] == "pulling manifest" and seen[-1] == "pulling org/tiny"
    finally:
        throttle.rate = None
    asked = len(throttle.ranges)
    done = served.client.pull(name)
    assert done.status == "success"
    # Resumed: the weights' rest was asked for from where their partial file ended (most of
    # the 1 MB seen; the small files count in it too).
    resumed = [int(r[len("bytes="):-1]) for r in throttle.ranges[asked:]]
    assert resumed and max(resumed) > 500_000, throttle.ranges
    listed = served.d.ctl("models").stdout
    assert "hf:org/tiny" in listed and "hubbed (ready)" in listed and " ago" in listed, listed
    assert "pulling manifest" in served.d.ctl("pull", f"hf:org/tiny@{v1}").stdout
    # /api/tags lists instances only: a pulled model serves once an instance names it.
    assert "org/tiny" not in {m.model for m in served.client.list().models}

    with pytest.raises(ollama.ResponseError) as e:
        served.client.delete("hubbed")
    assert e.value.status_code == 409 and "hubbed" in str(e.value.error)
    with pytest.raises(ollama.ResponseError) as e:
        served.client.delete("tiny")  # a directory of its own: not exod's cache
    assert e.value.status_code == 400 and "/tiny" in str(e.value.error)
    served.d.ctl("stop", "hubbed")
    assert served.client.delete("hf.co/org/tiny")["status"] == "success"
    assert not (served.cache / "models--org--tiny").exists()
    with pytest.raises(ollama.ResponseError) as e:
        served.client.delete("org/tiny")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        served.client.pull("org/nope", stream=False)
    assert e.value.status_code == 404 and "org/nope" in str(e.value.error)
    lines = [json.loads(x) for x in served.raw("POST", "/api/pull",
                                               {"model": "org/nope"})[2].splitlines()]
    assert lines[0] == {"status": "pulling manifest"} and "org/nope" in lines[-1]["error"]


# ---- hostile bodies ---------------------------------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=10)
NEAR = {
    "model": st.sampled_from(["capped", "nope", "org/nope-x", "llama3.2"]) | JSON,
    "messages": JSON | st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "tool"]) | JSON,
         "content": st.text(max_size=4) | JSON},
        optional={"tool_calls": JSON, "tool_name": JSON, "images": JSON, "thinking": JSON}),
        min_size=1, max_size=2),
    "options": JSON | st.dictionaries(st.sampled_from(
        ["num_predict", "num_ctx", "temperature", "top_k", "stop", "mirostat", "repeat_last_n",
         "seed", "num_gpu", "zz"]), JSON | st.integers(-3, 9), max_size=3),
    **{k: JSON for k in ("format", "think", "keep_alive", "tools", "prompt", "suffix",
                         "system", "template", "raw", "stream", "context", "insecure")}}


def test_hostile_bodies_get_a_4xx_in_seconds_never_a_5xx(served: Served) -> None:
    statuses: dict[int, int] = {}
    paths = ["/api/chat", "/api/generate", "/api/show", "/api/pull", "/api/delete",
             "/api/embed"]

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=st.fixed_dictionaries({}, optional=NEAR) | JSON, path=st.sampled_from(paths))
    def probe(body: Any, path: str) -> None:
        if isinstance(body, dict) and path in ("/api/pull", "/api/delete") and \
                body.get("model") not in (None, "nope", "capped", "org/nope-x"):
            body["model"] = "nope"  # a fetcher per repository pulled costs a second: a few
        method = "DELETE" if path == "/api/delete" else "POST"
        began = time.monotonic()
        status, headers, answer = served.raw(method, path, json.dumps(body, allow_nan=True)
                                             .encode(), timeout=30)
        assert time.monotonic() - began < 20, (path, body)
        statuses[status] = statuses.get(status, 0) + 1
        assert status < 500, (status, path, body, answer[:300])
        if status >= 400:
            assert isinstance(json.loads(answer)["error"], str), answer
    probe()
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0, statuses
    assert tracebacks(served.d) == []


def test_statistics_are_nanoseconds_from_the_request(served: Served) -> None:
    began = time.monotonic_ns()
    r = served.client.generate(model="capped", prompt="hi", options={"temperature": 0})
    took = time.monotonic_ns() - began
    assert r.done_reason == "length" and r.eval_count == 6  # the instance's cap
    assert 0 < (r.total_duration or 0) <= took
    parts = (r.load_duration or 0) + (r.prompt_eval_duration or 0) + (r.eval_duration or 0)
    assert math.isclose(parts, r.total_duration or 0, rel_tol=0.2, abs_tol=5_000_000)
