"""Named API keys, their pure parts: the keyring's matching, the config's keys (positions of
each problem, in the main file and in the keys file), the keys file's secret rule, `exoctl key
new`'s entry, and where a request's key may and may not be."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from click.testing import CliRunner

from exod.api import access
from exod.api.errors import ApiError, model_not_found
from exod.api.middleware import misplaced, offered_secret
from exod.cli.exoctl import main as exoctl
from exod.config import ConfigError, load_config
from exod.config.schema import Key
from exod.config.keys import KeysFileError, api_key, keyring_entries, read_keys_file
from exod.core.keys import (ANONYMOUS, HASH_RE, TOKEN, ApiKey, KeyLimits, Keyring, digest,
                            digest_of, hash_text, new_secret)

if TYPE_CHECKING:
    from tests.unit.conftest import ConfigDir

H1, H2 = hash_text("one"), hash_text("two")


def key_lines(*entries: str) -> str:
    return "api:\n  keys:\n" + "".join(f"    - {e}\n" for e in entries)


def instances(*names: str) -> str:
    return "instances:\n" + "".join(f"  {n}:\n    model: m\n" for n in names)


# ---- the keyring --------------------------------------------------------------------------
def test_a_secret_is_matched_by_its_hash_and_nothing_else_is() -> None:
    alice, bob = ApiKey("alice"), ApiKey("bob", scopes=frozenset({"infer"}))
    ring = Keyring([(digest(b"one"), alice), (digest(b"two"), bob)])
    assert ring.match(b"one") == (digest(b"one"), alice)
    assert ring.match(b"two") == (digest(b"two"), bob)
    for wrong in (b"", b"on", b"one ", b"ONE", H1.encode(), digest(b"one")):
        assert ring.match(wrong) is None
    assert ring.auth and ring.identities() == {digest(b"one"), digest(b"two")}


def test_no_key_and_no_token_is_no_auth_and_an_empty_keys_file_is_auth() -> None:
    assert not Keyring().auth and Keyring().identities() == {b""}
    closed = Keyring([], auth=True)  # api.keys_file set, every key revoked
    assert closed.auth and closed.identities() == set() and closed.match(b"") is None


def test_secrets_are_fresh_and_their_hash_is_what_the_config_takes() -> None:
    secrets = {new_secret() for _ in range(100)}
    assert len(secrets) == 100
    s = secrets.pop()
    assert s.startswith("exod-") and len(s) >= 40 and s.isascii() and " " not in s
    assert re.match(HASH_RE, hash_text(s)) and digest_of(hash_text(s)) == digest(s.encode())


def test_scopes_and_instances_of_a_key() -> None:
    infer = ApiKey("a", scopes=frozenset({"infer"}), instances=frozenset({"x"}))
    assert infer.may("infer") and not infer.may("manage") and not infer.may("admin")
    assert infer.sees("x") and not infer.sees("y")
    admin = ApiKey("b", scopes=frozenset({"admin"}))
    assert all(admin.may(s) for s in ("infer", "manage", "admin")) and admin.sees("y")
    assert all(k.may("admin") and k.sees("any") for k in (ANONYMOUS, TOKEN))


# ---- the config ---------------------------------------------------------------------------
def test_keys_in_the_config_reach_api_keys(cfg_dir: ConfigDir) -> None:
    main = cfg_dir.write("exod.yaml", key_lines(
        f"{{name: alice, owner: Alice, hash: '{H1}', scopes: [infer, manage], instances: [x],"
        " limits: {in_flight: 2, prompt_tokens_per_minute: 1000, tokens_per_month: 9000},"
        " weight: 3, priority: batch}",
        f"{{name: ci.night-1, hash: '{H2}'}}") + instances("x"))
    cfg = load_config(main)
    alice, ci = (api_key(k) for k in cfg.api.keys)
    assert alice == ApiKey("alice", "Alice", frozenset({"infer", "manage"}), frozenset({"x"}),
                           KeyLimits(in_flight=2, prompt_tokens_per_minute=1000,
                                     tokens_per_month=9000), 3.0, "batch")
    assert ci == ApiKey("ci.night-1", scopes=frozenset({"infer"}))  # the defaults
    entries = keyring_entries(cfg.api.keys, [digest(b"tok")])
    assert Keyring(entries).match(b"two") == (digest(b"two"), ci)
    assert Keyring(entries).match(b"tok") == (digest(b"tok"), TOKEN)


BAD = [
    ("unknown-instance", [f"{{name: a, hash: '{H1}', instances: [x, nope]}}"],
     (3, 50, "api.keys[0].instances[1]"), "no instance is named 'nope'"),
    ("name-twice", [f"{{name: a, hash: '{H1}'}}", f"{{name: a, hash: '{H2}'}}"],
     (4, 14, "api.keys[1].name"), "the key name 'a' is taken"),
    ("secret-twice", [f"{{name: a, hash: '{H1}'}}", f"{{name: b, hash: '{H1}'}}"],
     (4, 23, "api.keys[1].hash"), "the same secret as key 'a'"),
    ("bad-name", [f"{{name: 'a b', hash: '{H1}'}}"], (3, 14, "api.keys[0].name"),
     "does not match"),
    ("not-a-hash", ["{name: a, hash: 'sha256:abc'}"], (3, 23, "api.keys[0].hash"),
     "does not match"),
    ("no-hash", ["{name: a}"], (3, 7, "api.keys[0]"), "missing required key 'hash'"),
    ("weight-zero", [f"{{name: a, hash: '{H1}', weight: 0}}"], (3, 104, "api.keys[0].weight"),
     "must be more than 0"),
    ("scope-typo", [f"{{name: a, hash: '{H1}', scopes: [infer, mange]}}"],
     (3, 112, "api.keys[0].scopes[1]"), "did you mean 'manage'?"),
    ("limit-zero", [f"{{name: a, hash: '{H1}', limits: {{in_flight: 0}}}}"],
     (3, 116, "api.keys[0].limits.in_flight"), "must be at least 1"),
    ("priority", [f"{{name: a, hash: '{H1}', priority: urgent}}"],
     (3, 106, "api.keys[0].priority"), "must be one of 'interactive', 'batch'"),
]


@pytest.mark.parametrize("entries, where, fragment", [c[1:] for c in BAD],
                         ids=[c[0] for c in BAD])
def test_a_bad_key_is_a_config_error_at_its_place(cfg_dir: ConfigDir, entries: list[str],
                                                   where: tuple[int, int, str],
                                                   fragment: str) -> None:
    main = cfg_dir.write("exod.yaml", key_lines(*entries) + instances("x"))
    with pytest.raises(ConfigError) as info:
        load_config(main)
    line, col, path = where
    lines = [str(p) for p in info.value.problems]
    assert any(s.startswith(f"{main}:{line}:") and f": {path}: " in s and fragment in s
               for s in lines), "\n".join(lines)


def keys_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_keys_file_holds_a_list_of_keys(tmp_path: Path) -> None:
    path = keys_file(tmp_path, f"- name: a\n  hash: {H1}\n  instances: [x]\n"
                               f"- name: b\n  hash: {H2}\n  scopes: [admin]\n")
    a, b = read_keys_file(path, ["x"])
    assert (a.name, a.instances, b.name, b.scopes) == ("a", ("x",), "b", ("admin",))
    assert read_keys_file(keys_file(tmp_path, "# every key revoked\n"), []) == ()
    assert read_keys_file(keys_file(tmp_path, "[]\n"), []) == ()


def test_a_keys_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = keys_file(tmp_path, f"- name: a\n  hash: {H1}\n", mode=0o644)
    with pytest.raises(KeysFileError) as info:
        read_keys_file(path, [])
    assert str(info.value) == (f"api.keys_file: {path} has mode 0644: a secret must be closed "
                               f"to other users (chmod 600 {path}, or 640 to let its group "
                               "read it)")
    with pytest.raises(KeysFileError, match="cannot read"):
        read_keys_file(tmp_path / "absent.yaml", [])


def test_a_keys_file_problem_is_placed_in_it_and_said_on_one_line(tmp_path: Path) -> None:
    path = keys_file(tmp_path, f"- name: a\n  hash: {H1}\n  instances: [gone]\n"
                               f"- name: a\n  hash: {H2}\n")
    with pytest.raises(KeysFileError) as info:
        read_keys_file(path, ["x"])
    assert [str(p) for p in info.value.problems] == [
        f"{path}:3:15: keys_file[0].instances[0]: no instance is named 'gone'",
        f"{path}:4:9: keys_file[1].name: the key name 'a' is taken (by an earlier key)"]
    assert "\n" not in str(info.value) and str(info.value).endswith("(and 1 more)")
    taken = (Key(name="a", hash=H1),)
    with pytest.raises(KeysFileError, match="taken .by an earlier key in api.keys"):
        read_keys_file(keys_file(tmp_path, f"- name: a\n  hash: {H2}\n"), [], taken=taken)
    with pytest.raises(KeysFileError, match=":1:3: keys_file\\[0\\]: expected a mapping"):
        read_keys_file(keys_file(tmp_path, "- just-a-secret\n"), [])
    with pytest.raises(KeysFileError, match="expected a list"):
        read_keys_file(keys_file(tmp_path, f"name: a\nhash: {H1}\n"), [])


# ---- exoctl key ---------------------------------------------------------------------------
def test_exoctl_key_new_prints_a_secret_whose_entry_the_keys_file_takes(tmp_path: Path) -> None:
    out = CliRunner().invoke(exoctl, ["key", "new", "alice", "--owner", "Alice: ops",
                                      "--scopes", "infer,manage", "--instances", "x"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    secret = next(line for line in lines if line.startswith("exod-"))
    entry = "\n".join(line for line in lines if not line.startswith(("#", "exod-")))
    assert secret not in entry and hash_text(secret) in entry
    (key,) = read_keys_file(keys_file(tmp_path, entry + "\n"), ["x"])
    assert api_key(key) == ApiKey("alice", "Alice: ops", frozenset({"infer", "manage"}),
                                  frozenset({"x"}))
    assert Keyring(keyring_entries([key], [])).match(secret.encode()) is not None
    hashed = CliRunner().invoke(exoctl, ["key", "hash"], input=secret + "\n")
    assert hashed.output.strip() == key.hash
    for bad in (["new", "a b"], ["new", "a", "--scopes", "root"], ["new", "a", "--scopes", ","]):
        assert CliRunner().invoke(exoctl, ["key", *bad]).exit_code == 2


# ---- where a key is read, and what each route needs --------------------------------------
def request(path: str, headers: dict[str, str] | None = None) -> web.Request:
    return make_mocked_request("GET", path, headers=headers or {})


@pytest.mark.parametrize("path, headers, where", [
    ("/v1/models?key=SeCrEt", {}, "the query string (`key`)"),
    ("/v1/models?API_KEY=SeCrEt", {}, "the query string (`api_key`)"),
    ("/api/tags?a=1&token=SeCrEt", {}, "the query string (`token`)"),
    ("/v1/models", {"Authorization": "Basic SeCrEt"},
     "an `Authorization: Basic` header (only `Bearer` is read)"),
    ("/v1/models", {"api-key": "SeCrEt"}, "the `api-key` header"),
    ("/v1/models", {"x-goog-api-key": "SeCrEt"}, "the `x-goog-api-key` header"),
])
def test_a_key_in_the_wrong_place_is_found_and_not_repeated(path: str, headers: dict[str, str],
                                                            where: str) -> None:
    assert misplaced(request(path, headers)) == where  # which names no secret


def test_where_a_key_is_read() -> None:
    assert misplaced(request("/v1/models?limit=3", {"Authorization": "Bearer s"})) is None
    assert offered_secret(request("/", {"Authorization": "Bearer  s "})) == b"s"
    assert offered_secret(request("/", {"x-api-key": "k"})) == b"k"
    assert offered_secret(request("/", {"Authorization": "Bearer a", "x-api-key": "k"})) == b"a"
    assert offered_secret(request("/")) is None


def test_a_key_without_the_scope_is_told_which_scope() -> None:
    err = access.forbidden(ApiKey("ci", scopes=frozenset({"infer"})), "manage")
    assert err.status == 403 and "`manage`" in err.message and "ci" in err.message
    with pytest.raises(ApiError) as info:
        access.check_instance(ApiKey("ci", instances=frozenset({"x"})), "y", "y:latest")
    assert info.value.status == 404 and info.value.message == model_not_found("y:latest").message
    access.check_instance(ApiKey("ci", instances=frozenset({"x"})), "x", "x")
    access.check_instance(ApiKey("ci", instances=frozenset({"x"})), None, "nothing")
