"""Every message between the daemon and a runner, defined once, for both ends.

One channel per runner: the socketpair it inherits (`--channel-fd`, the only thing on its
command line), carrying `exod.wire.protocol` frames. Each frame holds one JSON object whose `type`
names a dataclass of this package (`lifecycle`, `events`, `work`); its other keys are that
dataclass's fields, checked by `exod.wire.protocol.from_wire` before either end acts on them. A
runner's first message is `Hello`, whose `version` must equal `VERSION`; the daemon's first is
the runner's start-up spec (`exod.wire.specs.RunnerSpec`). Fetchers (`python -m exod.hub`) speak on
the same kind of channel with a union of their own, and each end checks what it reads against
its own union. Which messages go which way: docs/api.md, "Daemon ↔ runner".

Imports nothing heavy: the daemon and the runner both use it. A field added to a message is a
new `VERSION`: the daemon refuses a runner speaking another one (a stale install after an
upgrade) with a clear error, instead of misreading it.
"""

from __future__ import annotations

import typing
from typing import Any

# Every message is re-exported here: some 70 modules (the runner's serving/ among them) use them
# as `m.Generate`, one namespace for both ends.
from exod.wire.messages.events import (VECTORS_BYTES, Done, Error, ErrorCode, FinishReason, Held,
                                  Prefill, Text, TokenLogprob, ToolCall, TopLogprob, Vectors)
from exod.wire.messages.lifecycle import (HEARTBEAT_EVERY, DownloadProgress, Failed, Fetched,
                                     Heartbeat, Hello, LoadProgress, Phase, Ready,
                                     ServingReport, Status, Stopping)
from exod.wire.messages.work import (Cancel, ClearCacheWork, Embed, Generate, Image, Shutdown,
                                     ToolChoice)
from exod.wire.protocol import from_wire as from_wire, to_wire as to_wire  # for the messages' users

__all__ = [
    "HEARTBEAT_EVERY", "VECTORS_BYTES", "VERSION", "Cancel", "ClearCacheWork", "Done",
    "DownloadProgress", "Embed", "Error", "ErrorCode", "Event", "Failed", "Fetched", "FinishReason",
    "FromFetcher", "FromRunner", "Generate", "Heartbeat", "Held", "Hello", "Image", "LoadProgress",
    "Message", "Phase", "Prefill", "Ready", "ServingReport", "Shutdown", "Status", "Stopping",
    "Text", "ToFetcher", "ToRunner", "TokenLogprob", "ToolCall", "ToolChoice", "TopLogprob",
    "Vectors", "Work", "decode_from_fetcher", "decode_from_runner", "decode_to_runner", "from_wire",
    "to_wire",
]

VERSION = 24  # 2: ServingReport; 3: Prefill; 4: Error.param; 5: Held;
# 6: Done.stop_sequence, Generate.count_only; 7: DownloadProgress, Fetched (the fetcher's messages);
# 8: Generate's tools fields, ToolCall; 9: the rest of the sampling set, logprobs,
# reasoning, chat_template_kwargs, cached_tokens; 10: Generate.strict_tools;
# 11: ServingReport's speculative decoding counts; 12: Done.reasoning_tokens;
# 13: Generate.think_budget; 14: Generate.names and context_edits, Done.applied_edits;
# 15: Generate.images and content parts (exod.core.images); 16: start-up specs (exod.wire.specs)
# on the channel, not argv; 17: Generate.context_window; 18: Embed, Vectors, ServingReport's batch
# counts; 19: Shutdown.grace, ClearCacheWork, ServingReport's disk tier; 20: ToolCall.call_id;
# 21: Error's context_length_exceeded, prompt_tokens, window, own_window; 22: RunnerSpec.kind;
# 23: ServingReport's shared prefix counts; 24: Generate.key, weight, priority,
# ServingReport.fair


FromRunner = (Hello | Status | LoadProgress | Ready | Failed | Heartbeat | Stopping | ServingReport
              | Prefill | Held | Text | ToolCall | Vectors | Done | Error)
ToRunner = Generate | Embed | Cancel | Shutdown | ClearCacheWork
Work = Generate | Embed  # a request, whichever kind of model it is for
FromFetcher = Hello | Status | DownloadProgress | Failed | Fetched | Stopping
ToFetcher = Shutdown
Event = Prefill | Held | Text | ToolCall | Vectors | Done | Error  # a request's stream
Message = FromRunner | ToRunner | FromFetcher

FROM_RUNNER: dict[str, type[Any]] = {c.type: c for c in typing.get_args(FromRunner)}
TO_RUNNER: dict[str, type[Any]] = {c.type: c for c in typing.get_args(ToRunner)}
FROM_FETCHER: dict[str, type[Any]] = {c.type: c for c in typing.get_args(FromFetcher)}
TO_FETCHER: dict[str, type[Any]] = {Shutdown.type: Shutdown}


def decode_from_runner(obj: dict[str, Any]) -> FromRunner:
    msg: FromRunner = from_wire(obj, FROM_RUNNER)
    return msg


def decode_from_fetcher(obj: dict[str, Any]) -> FromFetcher:
    msg: FromFetcher = from_wire(obj, FROM_FETCHER)
    return msg


def decode_to_runner(obj: dict[str, Any]) -> ToRunner:
    msg: ToRunner = from_wire(obj, TO_RUNNER)
    return msg

