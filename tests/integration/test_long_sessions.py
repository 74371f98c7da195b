"""Agent sessions longer than the model's context window keep working: Claude Code and Codex
CLI against exod, configured as docs/agents.md shows (tests.agents.clients), and told the
window as its "Long sessions" section shows (tests.agents.windows). Each runs through a
recording proxy (tests.agents.capture), so a test sees what exod was sent and answered.

The model is tests.models.agent (a one-layer model whose weights answer without steering) with
a smaller context window written into its config.json: 4096 tokens, which neither agent's
first request fits (Claude Code's tools and system prompt are ~23k tokens of this tokenizer,
Codex's ~18k), and 40960, which a first request fits and a few long turns pass. The turns grow
by pasted text (about 4.3 bytes a token here, near the 3-4 the agents assume): the model calls
a tool only once a session, so tool outputs cannot grow it.

What each agent does, as these tests hold it to:
- a first request past the window: exod's 400 in the dialect's words; the agent says so in
  its own ("Prompt is too long", "ran out of room in the model's context window") and exits,
  after one request; told the window, Claude Code does not even send it;
- Claude Code not told the window, on a turn past it: exod's 400 (`prompt is too long: N
  tokens > M maximum`); it compacts its conversation and answers;
- told the window, both compact before a prompt reaches it; exod never refuses one.

One daemon serves the module (two instances of the model): ~40 CPU-seconds in all, most of
it the prefill of the agents' first prompts; later turns reuse the prompt cache.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agents import clients, matrix, windows
from tests.agents.capture import Recorder, serve
from tests.harness import Daemon
from tests.models.agent import PLAIN, make_agent_model
from tests.models.tiny import with_tool_template

SMALL, LONG = "four-k", "long"
WINDOWS = {SMALL: 4096, LONG: 40960}
SAFETY = 300.0  # seconds: a bound against hangs; a turn takes a few
# Claude Code 2.1.332 matches errors against this expression (its binary's) to compact.
TOO_LONG = re.compile(r"^prompt is too long: (\d+) tokens > (\d+) maximum$")
# What each agent does past the window, as the matrix of docs/agents.md says it
# (tests.agents.matrix), once a test's asserts hold it to that.
FIRST = {"claude-code": "exod's 400; says “Prompt is too long”, exits 1",
         "codex": "exod's 400; says it “ran out of room”, exits 1"}
TOLD_FIRST = "sends nothing; says “Prompt is too long”, exits 1"
REFUSED_THEN_COMPACTS = "exod's 400; compacts, sends it again, goes on"
COMPACTS_FIRST = "compacts before the window, goes on"
# One line of pasted text: 20 tokens of the model's tokenizer (86 bytes).
LINE = "The function returns the default value of the parameter when the argument is missing.\n"


def pasted(tag: str, tokens: int) -> str:
    """A turn's prompt: a short ask, and about `tokens` tokens of text tagged `tag` (a test
    finds the tag in later requests while the text is still in the conversation)."""
    return f"Say hello. Here is {tag}, to keep in mind:\n" + LINE * (tokens // 20)


def windowed(model: Path, out: Path, window: int) -> Path:
    """A copy of `model` whose config.json (and tokenizer) give a context window of `window`:
    the runner refuses a prompt that fills it (exod.core.request_rules.fit_window)."""
    shutil.copytree(model, out)
    for name, key in (("config.json", "max_position_embeddings"),
                      ("tokenizer_config.json", "model_max_length")):
        path = out / name
        config = json.loads(path.read_text())
        config[key] = window
        path.write_text(json.dumps(config, indent=2))
    return out


class Session:
    """One agent's session in a home and a working folder of its own, turn by turn, each
    through a fresh recording proxy."""

    def __init__(self, url: str, agent: str, model: str, work: Path) -> None:
        self.url, self.agent, self.model = url, agent, model
        self.home, self.cwd = work / "home", work / "cwd"
        self.home.mkdir(parents=True)
        self.cwd.mkdir()
        self.turns = 0
        binary = clients.BIN / {"claude-code": "claude", "codex": "codex"}[agent]
        assert binary.exists(), (f"{binary} is missing: the test set-up installs the agents "
                                 "(make setup-test, or scripts/agents.sh)")

    def turn(self, prompt: str, window: int | None = None,
             compact_at: int | None = None) -> tuple[Any, Recorder]:
        """Run one turn (the first starts the session, later ones continue it); `window`:
        tell the agent the context window (tests.agents.windows). (completed process, what
        went through the proxy)."""
        recorder = Recorder()
        server = serve(recorder, upstream=self.url)
        try:
            base = f"http://127.0.0.1:{server.server_address[1]}"
            run = clients.RUNS[self.agent](base, self.model, prompt, self.home, self.cwd)
            if window is not None:
                run = windows.sized(run, self.agent, window, compact_at)
            if self.turns:
                run = windows.continued(run, self.agent)
            self.turns += 1
            return run(timeout=SAFETY), recorder
        finally:
            server.shutdown()
            server.server_close()


@pytest.fixture(scope="module")
def daemon(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("long-sessions")
    agent = make_agent_model(with_tool_template(tiny_model, tmp / "tools"), tmp / "agent")
    d = Daemon({"instances": {name: {"model": str(windowed(agent, tmp / name, window))}
                              for name, window in WINDOWS.items()}})
    try:
        d.start()
        for name in WINDOWS:
            d.until_state(name, "ready")
        yield d
    finally:
        d.close()


@pytest.fixture
def session(daemon: Daemon, tmp_path: Path) -> Iterator[Any]:
    made: list[Session] = []

    def make(agent: str, model: str) -> Session:
        made.append(Session(daemon.api_url(), agent, model, tmp_path / f"{agent}-{len(made)}"))
        return made[-1]
    yield make


def model_requests(recorder: Recorder) -> list[dict[str, Any]]:
    return [r for r in recorder.requests if r["method"] == "POST"
            and r["path"].endswith(("/v1/messages", "/v1/responses"))]


def error_of(record: dict[str, Any]) -> dict[str, Any]:
    body = json.loads(record["response"])
    assert record["response_headers"]["content-type"].startswith("application/json")
    return dict(body["error"])


def carries(record: dict[str, Any], text: str) -> bool:
    return text in json.dumps(record["body"])


def answered(proc: Any, recorder: Recorder) -> list[dict[str, Any]]:
    """The turn ended with the model's answer, and exod refused none of its requests."""
    assert proc.returncode == 0 and proc.stdout.strip() == PLAIN, recorder.told(proc, 300)
    reqs = model_requests(recorder)
    assert reqs and all(r["status"] == 200 for r in reqs), recorder.told(proc, 300)
    return reqs


# ---- a first request past the window ---------------------------------------------------------

def test_claude_code_says_its_first_request_is_too_long(session: Any) -> None:
    proc, rec = session("claude-code", SMALL).turn("Say hello.")
    assert proc.returncode != 0 and proc.stdout.startswith("Prompt is too long"), \
        rec.told(proc, 300)
    (only,) = model_requests(rec)  # no retry: it knows this error
    assert only["status"] == 400
    message = error_of(only)["message"]
    found = TOO_LONG.match(message)
    assert found and int(found[1]) > int(found[2]) == WINDOWS[SMALL] - 1, message
    assert json.loads(only["response"]) == {"type": "error", "error": {
        "type": "invalid_request_error", "message": message}}
    matrix.saw("claude-code", "json_tools", first_too_long=FIRST["claude-code"])


def test_claude_code_told_the_window_sends_nothing_that_cannot_fit(session: Any) -> None:
    proc, rec = session("claude-code", SMALL).turn("Say hello.", window=WINDOWS[SMALL])
    assert proc.returncode != 0 and proc.stdout.startswith("Prompt is too long"), \
        rec.told(proc, 300)
    assert model_requests(rec) == [], rec.told(proc, 300)
    matrix.saw("claude-code", "json_tools", first_too_long_told=TOLD_FIRST)


def test_codex_says_its_first_request_is_too_long(session: Any) -> None:
    proc, rec = session("codex", SMALL).turn("Say hello.")
    assert proc.returncode != 0, rec.told(proc, 300)
    assert "ran out of room in the model's context window" in proc.stderr, rec.told(proc, 300)
    assert proc.stdout.strip() == "", rec.told(proc, 300)  # no answer, garbled or not
    (only,) = model_requests(rec)
    assert only["status"] == 400
    err = error_of(only)
    assert (err["type"], err["code"], err["param"]) == \
        ("invalid_request_error", "context_length_exceeded", "input")
    assert "exceeds the context window" in err["message"]
    matrix.saw("codex", "json_tools", first_too_long=FIRST["codex"])


# ---- sessions that pass the window -----------------------------------------------------------

def test_a_claude_code_session_past_the_window_compacts_and_goes_on(session: Any) -> None:
    s = session("claude-code", LONG)
    window = WINDOWS[LONG]
    # Turn 1, set up as docs/agents.md's first section only: ~35k tokens fit.
    proc, rec = s.turn(pasted("log-one", 12000))
    first = answered(proc, rec)[-1]
    # Turn 2 passes the window: exod refuses it in Anthropic's words; Claude Code compacts
    # (its summary request and the turn again, now short) and answers.
    proc, rec = s.turn(pasted("log-two", 9000))
    assert proc.returncode == 0 and proc.stdout.strip() == PLAIN, rec.told(proc, 300)
    refused, *rest = model_requests(rec)
    assert refused["status"] == 400 and carries(refused, "log-one"), rec.told(proc, 300)
    found = TOO_LONG.match(error_of(refused)["message"])
    assert found and int(found[1]) >= window and int(found[2]) == window - 1, rec.told(proc, 300)
    assert rest and all(r["status"] == 200 for r in rest), rec.told(proc, 300)
    assert not carries(rest[-1], "log-one") and carries(rest[-1], "log-two"), \
        "the answered request still carries turn 1: no compaction"
    # Turn 3, told the window (docs/agents.md, Long sessions): the conversation is past
    # Claude Code's threshold, so it compacts before it sends; exod refuses nothing.
    proc, rec = s.turn(pasted("log-three", 4000), window=window)
    reqs = answered(proc, rec)
    assert not carries(reqs[-1], "log-two") and carries(reqs[-1], "log-three"), \
        rec.told(proc, 300)
    assert len(reqs) >= 2, "no summary request before the turn"
    assert carries(first, "log-one")
    matrix.saw("claude-code", "json_tools", past_window=REFUSED_THEN_COMPACTS,
               past_window_told=COMPACTS_FIRST)


def test_a_codex_session_told_the_window_compacts_and_goes_on(session: Any) -> None:
    """Codex compacts by a summary request of its own (the conversation, its instructions, no
    tools) and goes on from the summary; it keeps the user's own messages through it, so a
    turn's pasted text stays: only answers and tool outputs go."""
    s = session("codex", LONG)
    window, compact_at = WINDOWS[LONG], 24000
    turns = []
    for tag in ("log-one", "log-two", "log-three"):
        proc, rec = s.turn(pasted(tag, 4000), window=window, compact_at=compact_at)
        turns.append(answered(proc, rec))
    before, after = turns[1][-1], turns[2][-1]

    def answers(record: dict[str, Any]) -> list[Any]:
        return [i for i in record["body"]["input"] if i.get("role") == "assistant"]
    # Turn 2 carried turn 1's answer; turn 3 went on from a summary (the model's reply to
    # the summary request, carried as a user message), after a request with no tools.
    assert answers(before) and not answers(after), rec.told(proc, 300)
    assert any(not r["body"].get("tools") for r in turns[2][:-1]), rec.told(proc, 300)
    summary = [i for i in after["body"]["input"] if i.get("role") == "user"
               and PLAIN in json.dumps(i)]
    assert summary, rec.told(proc, 300)
    matrix.saw("codex", "json_tools", past_window_told=COMPACTS_FIRST)
