"""The chat core's errors in a dialect's own field names: a client that sent
`tools[0].input_schema` reads about `tools[0].input_schema`, not `tools[0].function.parameters`.

A dialect gives where each chat message came from (`origins`: its own parameter, and whether
the chat message's sub-fields keep their names there) and its table of renamed fields (longest
prefix first); an error whose `param` is neither keeps its name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from exod.api.errors import ApiError

Origin = tuple[str, bool]  # (the dialect's parameter, whether `.content`/`.role` carry over)
_MESSAGE = re.compile(r"messages\[(\d+)\](.*)")
_TOOL = re.compile(r"tools\[(\d+)\]\.function(\.parameters)?(.*)")


def dialect_param(param: str, origins: Sequence[Origin], table: Sequence[tuple[str, str]],
                  schema_key: str) -> str:
    m = _MESSAGE.fullmatch(param)
    if m is not None and int(m.group(1)) < len(origins):
        where, keeps = origins[int(m.group(1))]
        rest = m.group(2)
        return where + rest if keeps and rest.startswith((".content", ".role")) else where
    m = _TOOL.fullmatch(param)
    if m is not None:
        return f"tools[{m.group(1)}]" + (f".{schema_key}" if m.group(2) else "") + m.group(3)
    for chat, own in table:
        if param == chat or param.startswith((chat + ".", chat + "[")):
            return own + param[len(chat):]
    return param


def renamed(e: ApiError, origins: Sequence[Origin], table: Sequence[tuple[str, str]],
            schema_key: str) -> ApiError:
    if e.param is None:
        return e
    new = dialect_param(e.param, origins, table, schema_key)
    if new == e.param:
        return e
    # The message names the field in backticks, maybe a sub-field of it.
    message = re.sub("`" + re.escape(e.param) + r"(?=[`.\[])", "`" + new, e.message)
    return ApiError(e.status, message, e.type, e.code, new, e.headers)
