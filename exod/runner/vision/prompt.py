"""A request as a model that sees takes it: its pictures decoded and checked
(exod.runner.vision.images), its messages through mlx-vlm's chat template (which knows how each
family marks an image), the processor's work (each picture into its placeholder tokens and its
pixel arrays), then the same request rules as text (exod.runner.serving.prepare.read_prompt: the
window, tools, a grammar) on the token ids. Runs on the reader's thread, off the serve loop: the
processor makes arrays from numpy (no evaluation, no stream), as mlx-vlm's own server does on its
request threads; the vision tower runs later, in an engine step.

The processor is called as mlx-vlm's `generate` calls it (mlx_vlm.utils.prepare_inputs), for one
prompt, so the same picture and prompt give the same tokens, except that the tokenizer's padding
arguments stay out of it: mlx-vlm 0.7.10's LLaVA processor would hand them to transformers'
image processor, which refuses them (docs/design/vision.md).
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass, field
from typing import Any

from exod import messages as m
from exod.core import images as limits
from exod.core.request_rules import RequestError
from exod.runner.serving.grammar import Grammars
from exod.core import request_rules as rules
from exod.runner.serving.prepare import read_prompt
from exod.runner.serving.reading import Prompt
from exod.runner.vision.images import decode

__all__ = ["Seen", "read_seen"]


@dataclass(frozen=True)
class Seen(Prompt):
    """A prompt as read (exod.runner.serving.reading.Prompt), and what the model must see with
    it: the processor's outputs (pixels and the family's own arrays; none for text) and the
    SHA-256 of each picture's bytes, in the order the prompt shows them."""

    inputs: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] = ()


def read_seen(processor: Any, config: Any, tokenizer: Any, req: m.Generate, vocab: int,
              window: int | None, grammars: Grammars | None) -> Seen:
    """The request read (RequestError naming the field, a picture's part, at fault)."""
    if req.kind != "chat":  # a completion: plain text, as the text runner reads it
        read = read_prompt(tokenizer, req, vocab, window, grammars)
        return Seen(read.tokens, read.max_tokens, read.constraint, read.args_check,
                    read.applied_edits)
    if req.context_edits:  # they count tokens of a template that has no pictures yet
        raise RequestError("context_management is not supported yet for a model that sees",
                           req.named("context_edits"))
    order = [(n, req.named(where)) for n, where in _image_order(req.messages or [])]
    pictures = [_picture(req.images[n].data, where) for n, where in order]
    keys = tuple(hashlib.sha256(req.images[n].data.encode()).hexdigest() for n, _ in order)
    text = _template(processor, config, req)
    inputs = _process(processor, config, text, pictures)
    ids = inputs.pop("input_ids")
    tokens = [int(t) for t in ids[0].tolist()]
    read = read_prompt(tokenizer, req, vocab, window, grammars, tokens=tokens)
    return Seen(read.tokens, read.max_tokens, read.constraint, read.args_check,
                read.applied_edits, inputs=inputs, keys=keys)


def _image_order(messages: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(image index, where its part is) in the order the messages show the images."""
    return [(part["image"], f"messages[{i}].content[{j}]")
            for i, msg in enumerate(messages) if isinstance(msg.get("content"), list)
            for j, part in enumerate(msg["content"]) if part.get("type") == "image"]


def _picture(data: str, where: str) -> Any:
    try:
        return decode(data)
    except limits.ImageError as e:
        raise RequestError(f"{where}: the image cannot be used: {e}", where) from None


def _template(processor: Any, config: Any, req: m.Generate) -> str:
    """The prompt's text: mlx-vlm shapes the messages (a content's parts become its own: text,
    and {"type": "image"} where the family's marker goes), then the model's chat template
    renders them as the text runner's does, with the template's own defaults: mlx-vlm's own
    rendering would switch thinking off unless the request says otherwise."""
    from mlx_vlm.prompt_utils import apply_chat_template

    messages = [{**msg, "content": _parts(msg["content"])} for msg in req.messages or []]
    extra = rules.chat_template_kwargs(req.chat_template_kwargs or None)
    try:
        shaped = apply_chat_template(processor, config, messages, num_images=len(req.images),
                                     return_messages=True)
        renderer = processor if getattr(processor, "chat_template", None) is not None \
            else getattr(processor, "tokenizer", processor)
        text = renderer.apply_chat_template(shaped, tokenize=False, add_generation_prompt=True,
                                            tools=req.tools or None, **extra)
    except RequestError:
        raise
    except Exception as e:  # noqa: BLE001 -- a template that rejects the roles, the tools...
        raise RequestError(f"{type(e).__name__}: {e}", "messages") from e
    if not isinstance(text, str):
        raise RequestError("the chat template did not give text", "messages")
    return text


def _parts(content: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [{"type": "image"} if p["type"] == "image" else {"type": "text", "text": p["text"]}
            for p in content]


def _process(processor: Any, config: Any, text: str, pictures: list[Any]) -> dict[str, Any]:
    """The processor's outputs for one prompt, as mlx_vlm.utils.prepare_inputs makes them."""
    from mlx_vlm.utils import should_add_special_tokens

    special = should_add_special_tokens(config.model_type, processor)
    tokenizer = getattr(processor, "tokenizer", processor)
    if not pictures:
        out = tokenizer([text], add_special_tokens=special, return_tensors="mlx")
        return {"input_ids": out["input_ids"], "attention_mask": out["attention_mask"]}
    call = getattr(processor, "process", processor)
    kwargs: dict[str, Any] = {"text": [text], "images": pictures}
    if "add_special_tokens" in inspect.signature(call).parameters:
        kwargs["add_special_tokens"] = special
    try:
        out = dict(call(**kwargs))
    except Exception as e:  # noqa: BLE001 -- the family's processor refuses what it cannot take
        raise RequestError(f"the model's processor refused the images: {type(e).__name__}: "
                           f"{e}", "messages") from e
    if "images" in out:  # a few processors name them so (as prepare_inputs renames them)
        out["pixel_values"] = out.pop("images")
    return out

