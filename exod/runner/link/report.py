"""What a runner tells the daemon about itself: typed lifecycle messages on its channel.

A lost report never stops a load (the channel may be closing because exod is going away, and
then the runner stops anyway); `Channel.send` just returns False.
"""

from __future__ import annotations

from exod.wire import messages as m
from exod.runner.link.channel import Channel


def status(phase: m.Phase, text: str = "", attempt: int = 0, active: int = 0) -> m.Status:
    """A status message (its text: the phase's name, unless told), to send with others."""
    return m.Status(phase=phase, text=text or phase.value, attempt=attempt, active=active)


class Reporter:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def status(self, phase: m.Phase, text: str = "", attempt: int = 0, active: int = 0) -> None:
        self.channel.send(status(phase, text, attempt, active))

    def progress(self, loaded: int, total: int) -> None:
        self.channel.send(m.LoadProgress(loaded=loaded, total=total))

    def ready(self, vocab_size: int = 0, context_length: int = 0) -> None:
        self.channel.send(m.Ready(vocab_size=vocab_size, context_length=context_length))

    def failed(self, reason: str, exit_code: int) -> None:
        self.channel.send(m.Failed(reason=" ".join(reason.split()), exit_code=exit_code))

    def stopping(self, reason: str = "") -> None:
        self.channel.send(m.Stopping(reason=reason))

    def heartbeat(self) -> None:
        self.channel.send(m.Heartbeat())
