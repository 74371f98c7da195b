"""The API's named keys as the config declares them: `api.keys` (checked with the rest of the
config) and `api.keys_file` (a secret file, read by the API when exod starts and at each
reload, as `api.token_file` is), each checked against the instances it names, and made into
the `ApiKey`s the API resolves requests to (exod.core.keys)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from exod.config.errors import Mark, Problem
from exod.config.schema import Api, Key
from exod.config.validate import INVALID, Validator
from exod.config.yamlpos import MapNode, Node, Scalar, SeqNode, parse_yaml
from exod.core.keys import TOKEN, ApiKey, digest_of
from exod.secret_file import SecretFileError, read_secret


class KeysFileError(SecretFileError):
    """api.keys_file cannot be used: one line (the first problem, and how many more), and
    every problem, each at its FILE:LINE:COL. Never a secret (the file holds none)."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        first = str(problems[0]) if problems[0].file else problems[0].message
        super().__init__(f"api.keys_file: {first}{more}")
        self.problems = list(problems)


def auth_configured(api: Api) -> bool:
    """Whether requests must send a secret: any token file, keys file or key."""
    return api.token_file is not None or api.keys_file is not None or bool(api.keys)


def key_problems(keys: Sequence[Key], node: Node | None, path: str,
                 instances: Collection[str], taken: Sequence[Key] = ()) -> list[Problem]:
    """What is wrong with `keys` beyond each one's fields: a name or a secret given twice (also
    against `taken`, the keys declared elsewhere), an instance that does not exist. `node`:
    the list as written, to place each problem."""
    items = node.items if isinstance(node, SeqNode) else []
    names = {k.name: "api.keys" for k in taken}
    hashes = {k.hash: k.name for k in taken}
    out: list[Problem] = []
    for i, key in enumerate(keys):
        item = items[i] if i < len(items) else node
        where = f"{path}[{i}]"
        if key.name in names:
            elsewhere = "" if names[key.name] == path else f" in {names[key.name]}"
            out.append(Problem.at(_mark(item, "name"), f"{where}.name",
                                  f"the key name {key.name!r} is taken (by an earlier key"
                                  f"{elsewhere})"))
        names.setdefault(key.name, path)
        if key.hash in hashes:
            out.append(Problem.at(_mark(item, "hash"), f"{where}.hash",
                                  f"the same secret as key {hashes[key.hash]!r}: a secret "
                                  "names one key (make another with `exoctl key new`)"))
        hashes.setdefault(key.hash, key.name)
        for j, name in enumerate(key.instances or ()):
            if name not in instances:
                out.append(Problem.at(_item_mark(item, "instances", j),
                                      f"{where}.instances[{j}]",
                                      f"no instance is named {name!r}"))
    return out


def read_keys_file(path: Path, instances: Collection[str],
                   taken: Sequence[Key] = ()) -> tuple[Key, ...]:
    """The keys of api.keys_file, checked as api.keys are; raises KeysFileError."""
    display = str(path)
    try:
        raw = read_secret(path, least=0)
    except SecretFileError as e:  # its message names the file already
        raise KeysFileError([Problem("", 0, 0, "", str(e))]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise KeysFileError([Problem(display, 0, 0, "",
                                     f"not UTF-8 text (byte {e.start})")]) from None
    root, problems = parse_yaml(text, display)
    if problems:
        raise KeysFileError(problems)
    if root is None or (isinstance(root, Scalar) and root.value is None):
        return ()  # every key revoked: auth stays on, and nothing is accepted
    v = Validator()
    keys = v.value(tuple[Key, ...], root, "keys_file", root.mark, {})
    if v.problems or keys is INVALID:
        raise KeysFileError(v.problems)
    problems = key_problems(keys, root, "keys_file", instances, taken)
    if problems:
        raise KeysFileError(problems)
    return tuple(keys)


def api_key(key: Key) -> ApiKey:
    return ApiKey(key.name, key.owner, frozenset(key.scopes),
                  None if key.instances is None else frozenset(key.instances),
                  key.limits, key.weight, key.priority)


def keyring_entries(keys: Sequence[Key], tokens: Sequence[bytes]) -> list[tuple[bytes, ApiKey]]:
    """(digest, key) of every named key, and of every token of api.token_file (`tokens`: their
    digests), for exod.core.keys.Keyring."""
    return [*((digest_of(k.hash), api_key(k)) for k in keys), *((t, TOKEN) for t in tokens)]


def _mark(item: Node | None, key: str) -> Mark:
    if isinstance(item, MapNode) and key in item.entries:
        return item.entries[key].value.mark
    return item.mark if item is not None else Mark("")


def _item_mark(item: Node | None, key: str, j: int) -> Mark:
    if isinstance(item, MapNode) and key in item.entries:
        value = item.entries[key].value
        if isinstance(value, SeqNode) and j < len(value.items):
            return value.items[j].mark
    return _mark(item, key)
