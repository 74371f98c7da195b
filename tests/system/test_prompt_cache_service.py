"""The prompt cache's disk tier under a real systemd 252: with nothing about caching in the
config, a long prompt answered before `systemctl restart exod` is loaded from disk after it
(its tokens counted as cached), with the same answer; the stop stays at rung 1; the files are
the service user's, 0600, under its StateDirectory. One real runner (the tiny model), one
restart: ~4 CPU-seconds."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.system.systemd import CONFIG_PATH, VENV_EXOD, SystemdGuest

pytestmark = pytest.mark.system

UNIT = "exod.service"
EXOCTL = str(VENV_EXOD.parent / "exoctl")
SOCKET = "/run/exod/control.sock"
MODEL = "/var/lib/exod-test/tiny"  # guest-private tmpfs, readable by user exod
PROMPT = "Please read this agent's instructions. " + "Call the tools in order, then answer. " * 60


def chat(g: SystemdGuest) -> tuple[str, int, int]:
    """(answer, prompt tokens, cached tokens) of PROMPT, greedy, through `exoctl chat`."""
    res = g.run(EXOCTL, "--socket", SOCKET, "chat", "--json", "--temperature", "0",
                "--max-tokens", "6", "tiny", PROMPT)
    assert res.returncode == 0, res.stdout + res.stderr
    chunks: list[dict[str, Any]] = [json.loads(line) for line in res.stdout.splitlines()]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                   if c.get("choices"))
    usage = next(c["usage"] for c in chunks if c.get("usage"))
    return text, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def test_a_restart_of_the_service_keeps_the_prompt_cache(
        exod_unit: SystemdGuest, tiny_model_factory: Callable[..., Path]) -> None:
    g = exod_unit
    shutil.copytree(tiny_model_factory(layers=4), g.path(MODEL), dirs_exist_ok=True)
    g.write(CONFIG_PATH, json.dumps({"ready": "instances", "api": {"listen": "127.0.0.1:52415"},
                                     "instances": {"tiny": {"model": MODEL}}}) + "\n")
    assert g.systemctl("start", UNIT).returncode == 0, g.diagnostics(UNIT)
    cold, n, cached = chat(g)
    assert cached == 0 and n > 300

    assert g.systemctl("restart", UNIT).returncode == 0, g.diagnostics(UNIT)
    log = g.wait_journal(UNIT, "exod stopped")
    assert "ladder rung 1" in log and "ladder rung 2" not in log, log
    assert chat(g) == (cold, n, n - 1)

    # In the daemon's own folder of the shared one (named by its config file), every folder
    # 0700 and the service user's, the entries 0600.
    (mine,) = g.path("/var/lib/exod/prompt-cache").iterdir()
    (folder,) = (mine / "tiny" / "rank0").iterdir()
    entries = list(folder.glob("*.safetensors"))
    assert entries and all(p.stat().st_mode & 0o777 == 0o600 for p in entries)
    inside = f"/var/lib/exod/prompt-cache/{mine.name}/tiny/rank0/{folder.name}"
    owner = g.run("stat", "-c", "%U %a", inside, *(str(Path(inside).parents[i]) for i in range(4)))
    assert owner.stdout.split() == ["exod", "700"] * 5, owner.stdout
