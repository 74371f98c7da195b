"""Sealed reasoning (exod.api.seal: round trip, tampering, another key, the key file kept
across restarts with mode 0600) and a model's capabilities read from its tokenizer files
(exod.facts.caps), as /v1/models reports them."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from exod.api.seal import KEY_BYTES, Sealer, load_key
from exod.facts.caps import Capabilities, model_capabilities


def test_a_seal_round_trips_and_nothing_else_opens() -> None:
    sealer = Sealer(key=b"a" * KEY_BYTES)
    token = sealer.seal("deep thought é")
    assert sealer.open(token) == "deep thought é" and "deep" not in token
    payload = token.split(".")[1]
    forged = token.replace(payload, Sealer(key=b"a" * KEY_BYTES).seal("other").split(".")[1])
    for bad in (token[:-3] + "AAA", forged, Sealer(key=b"b" * KEY_BYTES).seal("x"), "gAAAA",
                "exod1.", "exod1.!!!.???", None, 5):
        assert sealer.open(bad) is None, bad


def test_the_key_is_made_once_private_and_kept_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "state" / "reasoning.key"
    token = Sealer(path).seal("kept")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert Sealer(path).open(token) == "kept"  # a new daemon, the same key
    path.write_bytes(b"short")  # damaged: replaced
    assert len(load_key(path)) == KEY_BYTES and len(path.read_bytes()) == KEY_BYTES


def test_an_unwritable_state_directory_falls_back_to_a_process_key(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    sealer = Sealer(blocker / "reasoning.key")  # a folder that cannot be made
    assert sealer.open(sealer.seal("x")) == "x"


def files(tmp: Path, template: str | None, added: list[str]) -> Path:
    config: dict[str, object] = {"added_tokens_decoder": {
        str(i): {"content": t} for i, t in enumerate(added)}}
    if template is not None:
        config["chat_template"] = template
    (tmp / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp


def test_capabilities_from_the_template_and_the_vocabulary(tmp_path: Path) -> None:
    qwen = "{% for t in tools %}<tool_call>{{ tool_call.name }}</tool_call>{% endfor %}"
    assert model_capabilities(files(tmp_path, qwen, ["<think>", "</think>"])) == \
        Capabilities(tools=True, thinking=True, vision=False)
    assert model_capabilities(files(tmp_path, "{{ messages }}", ["<think>"])) == \
        Capabilities(tools=False, thinking=False, vision=False)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl",
                                                      "vision_config": {"depth": 2}}))
    assert model_capabilities(tmp_path).vision is True
    (tmp_path / "chat_template.jinja").write_text("[TOOL_CALLS] {{ messages }}")
    assert model_capabilities(files(tmp_path, None, [])).tools is True
    assert model_capabilities(tmp_path / "missing") == Capabilities()


def test_odd_tokenizer_files_tell_nothing_rather_than_fail(tmp_path: Path) -> None:
    """/v1/models reads these files for every instance, loaded or not: a file of another shape
    (a list where an object was, a number, JSON nested past the parser's depth, bytes that are
    no UTF-8) made the whole listing a 500. Now what cannot be read tells nothing."""
    odd: list[tuple[object, object]] = [
        ({"added_tokens_decoder": [1, 2]}, None), ({"added_tokens_decoder": "x"}, None),
        ({"added_tokens_decoder": {"1": "<think>"}}, None), (None, {"added_tokens": 5}),
        (None, {"added_tokens": {"a": 1}}), (None, {"model": {"vocab": [["<think>", 0]]}}),
        (None, {"model": "bpe"}), ({"chat_template": ["x", 5, {"template": 3}]}, None),
        ({"chat_template": {"a": 1}}, None), ([1, 2], ["x"])]
    for config, tokenizer in odd:
        for name in ("tokenizer_config.json", "tokenizer.json", "chat_template.jinja"):
            (tmp_path / name).unlink(missing_ok=True)
        for name, data in (("tokenizer_config.json", config), ("tokenizer.json", tokenizer)):
            if data is not None:
                (tmp_path / name).write_text(json.dumps(data))
        caps = model_capabilities(tmp_path)
        assert caps.thinking in (False, None) and caps.tools in (False, None), (config, caps)
    (tmp_path / "tokenizer_config.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "tokenizer.json").write_bytes(b'{"model": {"vocab": {"\xff\xfe": 1}}}')
    assert model_capabilities(tmp_path) == Capabilities()
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "chat_template.jinja").write_bytes(b"\xff [TOOL_CALLS]")
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "[TOOL_CALLS]"}')
    assert model_capabilities(tmp_path).tools is True  # the config's, where the file is no text
