"""A request as a model that sees takes it: its pictures' headers read and checked, each and
together, before any is decoded, then each decoded at the model's resolution, one at a time
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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exod.wire import messages as m
from exod.core import images as limits
from exod.core import memory
from exod.core.request_rules import RequestError
from exod.runner.serving.grammar import Grammars
from exod.core import request_rules as rules
from exod.runner.serving.prepare import read_prompt
from exod.runner.serving.reading import Prompt
from exod.runner.vision.images import (BudgetHold, Fit, Opened, PictureBudget, decode_opened,
                                       give_back_memory, open_picture)

__all__ = ["Seen", "read_seen"]


@dataclass(frozen=True)
class Seen(Prompt):
    """A prompt as read (exod.runner.serving.reading.Prompt), and what the model must see with
    it: the processor's outputs (pixels and the family's own arrays; none for text) and the
    SHA-256 of each picture's bytes, in the order the prompt shows them. `hold`: its share of
    the runner's PictureBudget, until `let_go` (or until it is dropped)."""

    inputs: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] = ()
    hold: BudgetHold | None = None

    def let_go(self) -> None:
        """The tower has seen its pictures: their arrays go, and their share of the budget."""
        self.inputs.clear()
        if self.hold is not None:
            self.hold.release()


@dataclass(frozen=True)
class PictureDecoding:
    """How a runner decodes pictures: at the size its model's processor makes (`Fit`), within
    its budget."""

    fit: Fit
    budget: PictureBudget


def read_seen(processor: Any, config: Any, tokenizer: Any, req: m.Generate, vocab: int,
              window: int | None, grammars: Grammars | None,
              pictures: PictureDecoding | None = None) -> Seen:
    """The request read (RequestError naming the field, a picture's part, at fault)."""
    if req.kind != "chat":  # a completion: plain text, as the text runner reads it
        read = read_prompt(tokenizer, req, vocab, window, grammars)
        return Seen(read.tokens, read.max_tokens, read.constraint, read.args_check,
                    read.applied_edits)
    if req.context_edits:  # they count tokens of a template that has no pictures yet
        raise RequestError("context_management is not supported yet for a model that sees",
                           req.named("context_edits"))
    how = pictures or PictureDecoding(Fit(), PictureBudget(memory.picture_budget(None)))
    order = [(n, req.named(where)) for n, where in _image_order(req.messages or [])]
    opened = [(_checked(open_picture, req.images[n].data, where), where) for n, where in order]
    hold = _held(how, opened) if opened else None
    try:
        decoded = [_checked(decode_opened, o, where, how.fit) for o, where in opened]
        del opened  # each whole picture went as soon as it was reduced
        keys = tuple(hashlib.sha256(req.images[n].data.encode()).hexdigest() for n, _ in order)
        text = _template(processor, config, req)
        inputs = _process(processor, config, text, decoded)
        del decoded
        ids = inputs.pop("input_ids")
        tokens = [int(t) for t in ids[0].tolist()]
        read = read_prompt(tokenizer, req, vocab, window, grammars, tokens=tokens)
    except BaseException:
        if hold is not None:
            hold.release()
        raise
    finally:
        if order:
            give_back_memory()
    return Seen(read.tokens, read.max_tokens, read.constraint, read.args_check,
                read.applied_edits, inputs=inputs, keys=keys, hold=hold)


def _held(how: PictureDecoding, opened: list[tuple[Opened, str]]) -> BudgetHold:
    """The pictures' share of the runner's budget, taken before any is decoded (waiting while
    requests read before hold too much); RequestError naming them when they alone take more."""
    need = sum(o.cost(how.fit) for o, _ in opened)
    why = how.budget.problem(need)
    if why is not None:
        sizes = ", ".join(f"{where} ({o.width}x{o.height})" for o, where in opened)
        raise RequestError(f"{sizes}: the request's pictures cannot be used: {why}",
                           opened[0][1])
    return how.budget.take(need)


def _image_order(messages: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(image index, where its part is) in the order the messages show the images."""
    return [(part["image"], f"messages[{i}].content[{j}]")
            for i, msg in enumerate(messages) if isinstance(msg.get("content"), list)
            for j, part in enumerate(msg["content"]) if part.get("type") == "image"]


def _checked(step: Callable[..., Any], what: Any, where: str, *args: Any) -> Any:
    """A picture through `step` (open_picture or decode_opened), its ImageError a
    RequestError naming its part."""
    try:
        return step(what, *args)
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

