"""The serve loop's side of the hop (docs/design/hop.md): a quick request that finds no stream
running is read on the loop's own thread and admitted in the turn that took it, with no
hand-off to the reader's thread and back; any other is read on the reader's thread as before.
A step's events and the status they leave go out in one write."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from exod.runner.link.channel import Channel
from exod.runner.link.lifecycle import Lifecycle
from exod.runner.link.report import Reporter
from exod.runner.serving.loop import AsItComes, NoPromptCache, ServeLoop
from exod.runner.serving.reading import QUICK_CHARS, Prompt, quick
from exod.wire import messages as m


def chat(rid: str, text: str = "Say one word.", **kw: object) -> m.Generate:
    return m.Generate(id=rid, kind="chat", max_tokens=1,
                      messages=[{"role": "user", "content": text}], **kw)  # type: ignore[arg-type]


class Sent(Channel):
    """A channel with no daemon behind it that keeps each write's messages."""

    def __init__(self, life: Lifecycle) -> None:
        super().__init__(None, life)
        self.writes: list[list[m.FromRunner]] = []

    def send(self, msg: m.FromRunner) -> bool:
        return self.send_all([msg])

    def send_all(self, msgs: Sequence[m.FromRunner]) -> bool:
        if msgs:
            self.writes.append(list(msgs))
        return True


class Engine(NoPromptCache, AsItComes):
    """Each admitted request answers one token per step for `tokens` steps; the loop is asked
    to stop once `until` requests are done. `during_step` runs inside the first step."""

    def __init__(self, life: Lifecycle, until: int, tokens: int = 1,
                 during_step: Callable[[], None] | None = None) -> None:
        self.life, self.until, self.tokens, self.during_step = life, until, tokens, during_step
        self.read_on: dict[str, str] = {}  # request -> the thread that read it
        self.left: dict[str, int] = {}  # admitted, not done: tokens still to come
        self.steps: list[list[str]] = []  # each step: the requests it served
        self.done = 0

    @property
    def active(self) -> int:
        return len(self.left)

    def read(self, req: m.Generate) -> Prompt:
        self.read_on[req.id] = threading.current_thread().name
        return Prompt([1, 2, 3], 1)

    def admit(self, req: m.Generate, prompt: Prompt) -> None:
        self.left[req.id] = self.tokens

    def cancel(self, rid: str) -> None:
        self.left.pop(rid, None)

    def step(self) -> list[m.Event]:
        self.steps.append(sorted(self.left))
        if len(self.steps) == 1 and self.during_step is not None:
            self.during_step()
        events: list[m.Event] = []
        for rid in sorted(self.left):
            self.left[rid] -= 1
            events.append(m.Text(rid, "x"))
            if not self.left[rid]:
                del self.left[rid]
                events.append(m.Done(rid, "length", 3, self.tokens))
                self.done += 1
        if self.done >= self.until:
            self.life.request_stop("the test is over")
        return events

    def abort_all(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        gone, self.left = sorted(self.left), {}
        return [m.Error(rid, code, message) for rid in gone]

    def abort_prefilling(self, code: m.ErrorCode, message: str) -> list[m.Event]:
        return []

    def serving(self) -> m.ServingReport:
        return m.ServingReport("continuous", width=8, active=self.active)


def serve(engine: Engine, channel: Sent, life: Lifecycle, *requests: m.Generate
          ) -> ServeLoop[m.Generate, Prompt]:
    """Run a loop over `requests`, in its inbox before it starts, until the engine stops it."""
    loop: ServeLoop[m.Generate, Prompt] = ServeLoop(engine, channel, life, Reporter(channel),
                                                    heartbeat_every=60)
    for req in requests:
        channel.inbox.put(req)
    done = threading.Thread(target=loop.run, name="loop")
    done.start()
    done.join(30)
    assert not done.is_alive(), "the loop did not stop"
    return loop


def test_a_quick_request_is_read_and_admitted_by_the_loop_itself() -> None:
    life = Lifecycle()
    channel, engine = Sent(life), Engine(life, until=1)
    loop = serve(engine, channel, life, chat("r1"))
    assert engine.read_on == {"r1": "loop"}  # no hand-off to the reader's thread
    assert loop.reader._thread is None
    assert engine.steps[0] == ["r1"]  # admitted in the turn that took it, before any step
    # Its token, its end and the status they leave: one write, one wake-up of the daemon.
    last = next(w for w in channel.writes if any(isinstance(x, m.Done) for x in w))
    assert [type(x) for x in last] == [m.Text, m.Done, m.ServingReport, m.Status]
    assert last[-1] == m.Status(m.Phase.READY, "ready")


def test_a_burst_that_came_together_starts_in_one_step() -> None:
    life = Lifecycle()
    channel, engine = Sent(life), Engine(life, until=3)
    serve(engine, channel, life, chat("a"), chat("b"), chat("c"))
    assert set(engine.read_on.values()) == {"loop"}
    assert engine.steps[0] == ["a", "b", "c"]
    # One status for the three, and no "reading" on the way.
    statuses = [x.text for w in channel.writes for x in w if isinstance(x, m.Status)]
    assert statuses == ["serving 3 request(s)", "ready"]


def test_a_request_that_is_not_quick_is_read_on_the_readers_thread() -> None:
    life = Lifecycle()
    channel, engine = Sent(life), Engine(life, until=2)
    long = "x" * (QUICK_CHARS + 1)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    serve(engine, channel, life, chat("long", long), chat("tools", tools=tools))
    assert engine.read_on == {"long": "exod-reader", "tools": "exod-reader"}


def test_a_quick_request_never_stands_a_running_stream_still() -> None:
    """One that comes while another is being generated is read on the reader's thread, as the
    loop goes on stepping the other."""
    life = Lifecycle()
    channel = Sent(life)
    engine = Engine(life, until=2, tokens=3,
                    during_step=lambda: channel.inbox.put(chat("second")))
    serve(engine, channel, life, chat("first"))
    assert engine.read_on == {"first": "loop", "second": "exod-reader"}
    assert engine.steps[0] == ["first"]


def test_quick_is_a_short_text_with_nothing_to_compile() -> None:
    assert quick(chat("r", "hi"))
    assert quick(m.Generate(id="r", kind="completion", max_tokens=1, prompt="x" * QUICK_CHARS))
    assert not quick(m.Generate(id="r", kind="completion", max_tokens=1,
                                prompt="x" * (QUICK_CHARS + 1)))
    assert not quick(chat("r", "x" * (QUICK_CHARS + 1)))
    assert not quick(chat("r", response_format={"type": "json_object"}))
    assert not quick(chat("r", think_budget=16))
    assert not quick(chat("r", context_edits=[{"type": "clear_tool_uses_20250919"}]))
    calls = m.Generate(id="r", kind="chat", max_tokens=1, messages=[
        {"role": "assistant", "content": "", "tool_calls": []}])
    assert not quick(calls)  # more than a role and a text: left to the reader
    assert not quick(m.Embed(id="r", kind="embed", texts=["hi"]))
