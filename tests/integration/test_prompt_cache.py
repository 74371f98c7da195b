"""The prompt cache's disk tier through real daemons, runners and restarts (the tiny model).

After a restart of the daemon (rung 1 writes what is not on disk yet), or a kill -9 of the
daemon and its runners (what was written while idle survives), the same long prompt is loaded
from disk: `usage` counts its tokens as cached, the answer is the cold one, and status and
/metrics say which tier served it. New weights at the same path, another adapter, other KV
settings: a miss, and the stale folder goes. A truncated, a corrupt and an unreadable file: a
miss each, one log line each, then served. A full disk (a small tmpfs): served, one log line.
A quantized KV cache (kv_bits): a hit in RAM, and on disk after a restart.
A stop during a disk load: rung 1, exit 0. A pipeline and a tensor group: a hit after a restart;
a pipeline split otherwise: a miss.
`exoctl cache clear` on a running and on a stopped instance; a `warm:` prompt at start.

One daemon for the module, an instance per test (autostart false but for `t`), stopped by its
test. The engine's own behaviour on every family of the zoo: test_prompt_cache_engine.py.
About 50 CPU-seconds: ~30 runner starts of ~1.5 CPU-s, the rest prefill of ~1k-token prompts
(with test_prompt_cache_engine.py and its zoo: ~100 CPU-s measured).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from exod.paths import daemon_id
from tests.harness import REPO, SAFETY, Daemon, wait_pid_gone

EOS = "2"  # the tiny model's end token: banned, every answer has max_tokens tokens
WORDS = ("the quick brown fox jumps over the lazy dog while a careful agent reads its tools "
         "and writes small functions that return lists of numbers ").split()


def long_prompt(seed: str, words: int = 400) -> str:
    """About 2 tokens a word for the tiny tokenizer: ~800 tokens, a different one per seed."""
    return seed + ": " + " ".join(WORDS[(i * 7 + len(seed)) % len(WORDS)] for i in range(words))


@pytest.fixture(scope="module")
def models(tiny_model: Path, tiny_model_factory: Callable[..., Path],
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pc-models")
    own = root / "own"  # its weights are replaced in a test
    shutil.copytree(tiny_model, own, ignore=shutil.ignore_patterns(".exod-*"))
    lora, other = root / "lora", root / "lora-8"  # two adapters of the same shapes
    subprocess.run([sys.executable, "-c", (
        "import sys; from pathlib import Path; "
        "from tests.integration.mlx_options_reference import make_adapter; "
        "make_adapter(sys.argv[1], Path(sys.argv[2])); "
        "make_adapter(sys.argv[1], Path(sys.argv[3]), seed=8)"),
        str(tiny_model), str(lora), str(other)], cwd=REPO, check=True, capture_output=True,
        timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    warm = root / "agent.json"
    warm.write_text(json.dumps({"messages": [{"role": "system",
                                              "content": long_prompt("system", 300)}]}))
    return {"tiny": tiny_model, "own": own, "other": tiny_model_factory(seed=7), "lora": lora,
            "lora-8": other, "warm": warm}


@pytest.fixture(scope="module")
def tmpfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 256 KiB filesystem: an entry of the tiny model's ~800-token prompt (~1.6 MB) never
    fits (the tests run as root)."""
    where = tmp_path_factory.mktemp("full")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(where)],
                   check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture(scope="module")
def d(models: dict[str, Path], tmpfs: Path) -> Iterator[Daemon]:
    tiny = str(models["tiny"])
    off = {"autostart": False}
    daemon = Daemon({"ready": "instances", "instances": {
        "t": {"model": tiny},
        "w": {"model": str(models["own"]), **off},
        "lora": {"model": tiny, "adapters": str(models["lora"]), **off},
        "rot": {"model": tiny, "max_kv_size": 4096, **off},
        "kv8": {"model": tiny, "kv_bits": 8, "kv_group_size": 32, "quantized_kv_start": 0,
                **off},
        "damaged": {"model": tiny, **off},
        "full": {"model": tiny, "prompt_cache_dir": str(tmpfs), **off},
        "loading": {"model": tiny, **off},
        "warm": {"model": tiny, "warm": [str(models["warm"])], **off},
        "pp": {"model": tiny, "shards": 2, **off},
        "tp": {"model": tiny, "shards": 2, "parallelism": "tensor", **off},
    }}, name="pcache")
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.close()


def chat(d: Daemon, model: str, content: str, **kw: Any) -> tuple[str, int, int]:
    """(answer, prompt tokens, cached tokens), greedy and of a fixed length."""
    c = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0, timeout=300)
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                  max_tokens=8, temperature=0, logit_bias={EOS: -100}, **kw)
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    return (r.choices[0].message.content or "", r.usage.prompt_tokens,
            r.usage.prompt_tokens_details.cached_tokens or 0)


def disk(d: Daemon, name: str) -> dict[str, Any]:
    # The runner reports its serving figures after READY: a test that opens with this (the
    # daemon just started, or restarted by the test before) waits for that report.
    cache = d.until_instance(name, lambda i: (i["serving"] or {}).get("prompt_cache") is not None,
                             what=f"{name}'s prompt cache figures")["serving"]["prompt_cache"]
    assert cache is not None and cache["disk"] is not None
    return dict(cache["disk"])


def on_disk(d: Daemon, name: str, entries: int | None = None, more_than: int = -1
            ) -> dict[str, Any]:
    """Wait until the runner says its disk holds `entries` entries (or more than
    `more_than`): written while idle, or cleared."""
    def held(i: dict[str, Any]) -> bool:
        cache = (i.get("serving") or {}).get("prompt_cache") or {}
        n = (cache.get("disk") or {}).get("entries", -1)
        return n == entries if entries is not None else n > more_than
    inst = d.until_instance(name, held, what=f"entries of {name} on disk")
    return dict(inst["serving"]["prompt_cache"]["disk"])


def cache_dir(d: Daemon, name: str) -> Path:
    """The instance's folder of the disk tier (the harness's CACHE_DIRECTORY puts it there), in
    this daemon's own folder (named by its config file)."""
    return d.dir / "cache" / "prompt-cache" / daemon_id(d.config_path) / name


def folder(d: Daemon, name: str) -> Path:
    """The one fingerprint folder rank 0 of `name` keeps its entries in."""
    (fp,) = (cache_dir(d, name) / "rank0").iterdir()
    return fp


def ladder_steps(d: Daemon, name: str) -> list[str]:
    return [rec["extra"]["step"] for rec in d.events(event="ladder", instance=name)]


def metric(d: Daemon, name: str, labels: str) -> float:
    with urllib.request.urlopen(d.api_url() + "/metrics", timeout=30) as r:
        text = r.read().decode()
    line = next(x for x in text.splitlines() if x.startswith(f"{name}{{{labels}}}"))
    return float(line.rsplit(" ", 1)[1])


def restart_daemon(d: Daemon, sig: int = signal.SIGTERM) -> None:
    if sig == signal.SIGKILL:  # the daemon and every runner, at once: no ladder, no flush
        pids = [r["pid"] for i in d.status()["instances"] for r in i["ranks"] if r["pid"]]
        d.terminate(signal.SIGKILL)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            assert wait_pid_gone(pid)
    else:
        assert d.terminate(sig) == 0
    d.start()


def test_a_restart_then_the_same_long_prompt_is_loaded_from_disk(d: Daemon) -> None:
    prompt = long_prompt("restart")
    cold, n, cached = chat(d, "t", prompt)
    assert cached == 0 and n > 500
    restart_daemon(d)  # rung 1 writes it, if idle did not already
    assert ladder_steps(d, "t") == ["ask"]
    warm, again, cached = chat(d, "t", prompt)
    assert (warm, again, cached) == (cold, n, n - 1)
    tier = disk(d, "t")
    assert tier["state"] == "ready" and tier["hits"] == 1 and tier["cached_tokens"] == n - 1
    assert tier["hit_rate"] == 1.0 and tier["load_s"] > 0 and tier["errors"] == 0
    assert metric(d, "exod_prompt_cache_hits_total", 'instance="t",tier="disk"') == 1
    assert metric(d, "exod_prompt_cache_misses_total", 'instance="t",tier="ram"') == 1
    assert metric(d, "exod_prompt_cache_load_seconds_total", 'instance="t",tier="disk"') > 0
    row = next(x for x in d.ctl("status").stdout.splitlines() if x.startswith("t: "))
    assert "on disk 1 entries" in row and "hit rate 100%" in row, row
    # Each dialect counts it: the Messages API's cache_read_input_tokens (a RAM hit now).
    m = anthropic.Anthropic(base_url=d.api_url(), api_key="-", max_retries=0).messages.create(
        model="t", max_tokens=8, messages=[{"role": "user", "content": prompt}])
    assert m.usage.cache_read_input_tokens == n - 1


def test_kill_9_of_the_daemon_and_its_runners_keeps_what_was_on_disk(d: Daemon) -> None:
    prompt = long_prompt("killed")
    before = disk(d, "t")["entries"]
    cold, n, _ = chat(d, "t", prompt)
    on_disk(d, "t", more_than=before)  # written while idle
    restart_daemon(d, signal.SIGKILL)
    assert chat(d, "t", prompt) == (cold, n, n - 1)
    # Files are the runner's alone: 0600 in 0700 folders.
    for p in folder(d, "t").iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder(d, "t").stat().st_mode) == 0o700


def start(d: Daemon, *names: str) -> None:
    for name in names:
        d.ctl("start", name)
    for name in names:
        d.until_state(name, "ready")


def stop(d: Daemon, *names: str) -> None:
    for name in names:
        d.ctl("stop", name)


def test_other_weights_adapters_or_kv_settings_are_a_miss(d: Daemon,
                                                          models: dict[str, Path]) -> None:
    start(d, "w", "lora", "rot")
    prompt = long_prompt("changes")
    for name in ("w", "lora", "rot"):
        chat(d, name, prompt)
        on_disk(d, name, 1)
    stop(d, "w", "lora", "rot")
    old = {name: folder(d, name) for name in ("w", "lora", "rot")}
    # New weights at the same path, the same size: only their content says they are new.
    shutil.copyfile(models["other"] / "model.safetensors", models["own"] / "model.safetensors")
    shutil.copyfile(models["lora-8"] / "adapters.safetensors",
                    models["lora"] / "adapters.safetensors")
    config = yaml_config(d)
    config["instances"]["rot"]["max_kv_size"] = 2048
    config["instances"]["q8"] = {"model": str(models["tiny"]), "kv_bits": 8,
                                 "kv_group_size": 32}
    d.write_config(config)
    d.ctl("reload")
    start(d, "w", "lora", "rot", "q8")
    for name in ("w", "lora", "rot"):
        _, _, cached = chat(d, name, prompt)
        assert cached == 0, name
        assert disk(d, name)["hits"] == 0
        assert folder(d, name) != old[name] and not old[name].exists()  # the stale one went
    # A quantized KV cache keeps its own prompt cache (its fingerprint has the KV settings).
    assert chat(d, "q8", prompt)[2] == 0 and disk(d, "q8")["hits"] == 0
    stop(d, "w", "lora", "rot", "q8")


def test_a_quantized_kv_cache_hits_in_ram_then_on_disk_after_a_restart(d: Daemon) -> None:
    """kv_bits in the batch: its quantized entries are kept in RAM and written to disk, and
    read back after a restart: the answer is the cold one."""
    start(d, "kv8")
    prompt = long_prompt("quantized")
    cold, n, cached = chat(d, "kv8", prompt)
    assert cached == 0 and n > 500
    assert chat(d, "kv8", prompt) == (cold, n, n - 1)  # RAM
    assert d.instance("kv8")["serving"]["batching"] == "continuous"
    on_disk(d, "kv8", more_than=0)
    restart_daemon(d)
    start(d, "kv8")
    assert chat(d, "kv8", prompt) == (cold, n, n - 1)
    tier = disk(d, "kv8")
    assert tier["hits"] == 1 and tier["cached_tokens"] == n - 1 and tier["errors"] == 0
    stop(d, "kv8")


def yaml_config(d: Daemon) -> dict[str, Any]:
    import yaml

    loaded: dict[str, Any] = yaml.safe_load(d.config_path.read_text())
    return loaded


def test_damaged_files_are_a_miss_each_with_one_line_then_served(d: Daemon) -> None:
    start(d, "damaged")
    prompts = [long_prompt(f"damaged {i}") for i in range(3)]
    cold = [chat(d, "damaged", p)[0] for p in prompts]
    on_disk(d, "damaged", 3)
    stop(d, "damaged")
    files = sorted(folder(d, "damaged").iterdir())
    files[0].write_bytes(files[0].read_bytes()[:-1000])  # truncated
    raw = bytearray(files[1].read_bytes())
    raw[-1000] ^= 0xFF  # corrupt data (its header reads well: the CRC tells)
    files[1].write_bytes(bytes(raw))
    files[2].unlink()
    files[2].mkdir()  # unreadable: what stands at its name cannot be read as a file
    start(d, "damaged")
    for p, c in zip(prompts, cold, strict=True):
        text, n, cached = chat(d, "damaged", p)
        assert text == c and cached < 20, (n, cached)  # at most the template's opening (RAM)
    tier = disk(d, "damaged")
    assert tier["hits"] == 0 and tier["errors"] == 3
    said = [rec["message"] for rec in d.events(instance="damaged")
            if "prompt cache on disk: cannot" in rec["message"]]
    assert len(said) == 3, said
    on_disk(d, "damaged", 3)  # each written again, whole, under its name
    assert all(f.is_file() for f in files)
    stop(d, "damaged")


def test_a_full_disk_is_served_with_one_log_line(d: Daemon, tmpfs: Path) -> None:
    start(d, "full")
    for i in range(2):
        assert chat(d, "full", long_prompt(f"full {i}"))[0]
    d.until_instance("full", lambda i: i["serving"]["prompt_cache"]["disk"]["errors"] >= 2,
                     what="both writes refused")
    said = [rec["message"] for rec in d.events(instance="full")
            if "prompt cache on disk" in rec["message"]]
    assert len(said) == 1 and "nearly full" in said[0], said
    assert disk(d, "full")["entries"] == 0
    stop(d, "full")
    assert ladder_steps(d, "full") == ["ask"]


def test_a_stop_during_a_disk_load_ends_at_rung_1(d: Daemon) -> None:
    start(d, "loading")
    prompt = long_prompt("loading")
    chat(d, "loading", prompt)
    on_disk(d, "loading", 1)
    d.ctl("restart", "loading")
    d.until_state("loading", "ready")
    # The entry, indexed by the new runner, becomes a pipe no one writes: its load can only
    # wait, so the stop below comes while it is loading.
    (entry,) = folder(d, "loading").iterdir()
    pipe = entry.with_name(".pipe")
    os.mkfifo(pipe)
    os.replace(pipe, entry)
    answered: list[BaseException | str] = []
    t = threading.Thread(target=lambda: answered.append(_try(d, prompt)))
    t.start()
    fd = None
    while fd is None:  # the runner opens the pipe to check it: it is loading
        try:
            fd = os.open(entry, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            time.sleep(0.05)
            assert t.is_alive(), answered
    pid = d.instance("loading")["ranks"][0]["pid"]
    try:
        stop(d, "loading")
    finally:
        os.close(fd)
    t.join(60)
    assert ladder_steps(d, "loading")[-1:] == ["ask"] and "SIGTERM" not in ladder_steps(d,
                                                                                    "loading")
    last = d.instance("loading")["ranks"][0]["last_exit"]
    assert last["code"] == 0 and wait_pid_gone(pid)
    assert answered and isinstance(answered[0], openai.APIError), answered


def _try(d: Daemon, prompt: str) -> BaseException | str:
    try:
        return chat(d, "loading", prompt)[0]
    except openai.APIError as e:
        return e


def test_cache_clear_empties_a_running_and_a_stopped_instance(d: Daemon) -> None:
    prompt = long_prompt("clear")
    chat(d, "t", prompt)
    out = d.ctl("cache", "clear", "t").stdout
    assert out.strip() == "t: cleared by its runners"
    on_disk(d, "t", 0)
    assert d.instance("t")["serving"]["prompt_cache"]["entries"] == 0
    assert chat(d, "t", prompt)[2] == 0
    on_disk(d, "t", 1)
    stop(d, "t")
    out = d.ctl("cache", "clear").stdout
    assert "t: not running; " in out and "removed from disk" in out
    assert list(cache_dir(d, "t").glob("rank*")) == []
    start(d, "t")


def test_a_warm_prompt_is_prefilled_at_start_unless_the_cache_holds_it(
        d: Daemon, models: dict[str, Path]) -> None:
    start(d, "warm")
    on_disk(d, "warm", 1)  # prefilled, then written while idle
    system = json.loads(models["warm"].read_text())["messages"]
    c = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0, timeout=300)
    r = c.chat.completions.create(model="warm", max_tokens=4, messages=[
        *system, {"role": "user", "content": "hello"}])
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens > 500
    d.ctl("restart", "warm")
    said = said_by(d, "warm", "warm: ", 2)  # the runner logs it right after it is ready
    assert "prefilling" in said[0] and "in the prompt cache already" in said[1], said
    stop(d, "warm")


def said_by(d: Daemon, name: str, needle: str, n: int) -> list[str]:
    """The first `n` log lines of `name`'s runners that say `needle`, once they are there."""
    deadline = time.monotonic() + SAFETY
    while True:
        said = [rec["message"] for rec in d.events(instance=name) if needle in rec["message"]]
        if len(said) >= n or time.monotonic() > deadline:
            return said
        time.sleep(0.1)


@pytest.mark.parametrize("name", ["pp", "tp"])
def test_a_group_hits_after_a_restart_only_when_every_rank_holds_the_entry(
        d: Daemon, name: str) -> None:
    start(d, name)
    prompt = long_prompt(f"group {name}")
    cold, n, _ = chat(d, name, prompt)
    d.ctl("restart", name)  # every rank writes its own layers' part
    d.until_state(name, "ready")
    assert chat(d, name, prompt) == (cold, n, n - 1)
    assert disk(d, name)["hits"] == 1
    stop(d, name)
    # Rank 1 loses its part: rank 0 still holds its own, and chooses it; rank 1 cannot load
    # it, and the group agrees on a miss for every rank: a whole prefill, the same answer.
    (part,) = (cache_dir(d, name) / "rank1").glob("*/*.safetensors")
    assert list((cache_dir(d, name) / "rank0").glob("*/*.safetensors"))
    part.unlink()
    start(d, name)
    text, _, cached = chat(d, name, prompt)
    assert (text, disk(d, name)["hits"]) == (cold, 0) and cached < 20
    stop(d, name)


def test_a_pipeline_split_differently_is_a_miss(d: Daemon) -> None:
    """The same model and prompt on the same two ranks, with their layers split otherwise: each
    rank's KV is of other layers, so a miss, and the old split's folders go."""
    start(d, "pp")
    prompt = long_prompt("split")
    cold, _, _ = chat(d, "pp", prompt)
    stop(d, "pp")  # rung 1: each rank writes its part
    old = {rank: folder for rank in ("rank0", "rank1")
           for folder in (cache_dir(d, "pp") / rank).iterdir()}
    config = yaml_config(d)
    config["instances"]["pp"]["layers"] = [1, 3]  # the tiny model's 4 layers, not 2 and 2
    d.write_config(config)
    d.ctl("reload")
    try:
        start(d, "pp")
        text, _, cached = chat(d, "pp", prompt)
        assert text == cold and cached < 20 and disk(d, "pp")["hits"] == 0
        for rank, was in old.items():
            (now,) = (cache_dir(d, "pp") / rank).iterdir()
            assert now != was and not was.exists(), rank
        stop(d, "pp")
    finally:
        del config["instances"]["pp"]["layers"]
        d.write_config(config)
        d.ctl("reload")
