"""Chat completions' and completions' answers, from the typed answer (exod.api.reply): a whole
one is a chat completion (or text completion) object; a streamed one its chunks as `data:`
lines (the role first, for chat), the finish reason's chunk, the usage's when
`stream_options.include_usage` asked, and `[DONE]` last."""

from __future__ import annotations

from typing import Any

from exod.wire import messages as m
from exod.api import sse
from exod.api.dialects.openai.objects import ChatObjects, streamed_call
from exod.api.errors import ApiError
from exod.api.reply import Called, Delta, Finished, Reply
from exod.api.request import GenRequest
from exod.api.stop_reasons import wording


class OpenAiOutput:
    stream_headers = sse.HEADERS

    def __init__(self, req: GenRequest) -> None:
        self.kind = req.gen.kind
        self.model = req.model
        self.include_usage = req.include_usage
        self.logprobs = req.gen.logprobs
        self._objects: ChatObjects | None = None

    def _made(self, include_usage: bool = False) -> ChatObjects:
        """The objects of this answer: made once it begins (their `created`)."""
        if self._objects is None:
            self._objects = ChatObjects(self.kind, self.model, include_usage=include_usage,
                                        logprobs=self.logprobs)
        return self._objects

    def seen(self, ev: m.Event) -> None:
        pass

    def whole(self, reply: Reply) -> dict[str, Any]:
        return self._made().whole(reply)

    def begin(self) -> bytes:
        objects = self._made(self.include_usage)
        return sse.frame(objects.chunk(role=True)) if self.kind == "chat" else b""

    def delta(self, d: Delta) -> bytes:
        objects = self._made(self.include_usage)
        if isinstance(d, Called):
            return b"".join(sse.frame(objects.chunk(tool_calls=piece))
                            for piece in streamed_call(d.call, d.index))
        if isinstance(d, Finished):
            out = sse.frame(objects.chunk(finish_reason=wording(d.stop).openai))
            return out + sse.frame(objects.usage_chunk(d.usage)) if self.include_usage else out
        # A piece that is reasoning alone leaves `content` out of its delta.
        text = d.text if d.text or not d.reasoning else None
        return sse.frame(objects.chunk(text, reasoning=d.reasoning, logprobs=d.logprobs))

    def failed(self, err: ApiError) -> bytes:
        return sse.frame(err.body())

    def end(self) -> bytes:
        return sse.DONE
