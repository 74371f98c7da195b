"""Models named by hub repository, fetched from a real hub-compatible server (olah, offline, on
this host: tests/hub.py) through a throttling proxy: progress, sharing, stop at rung 1, resume
after kill -9, verification, offline starts, a disk too small, a reload to a new revision."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.harness import EXOD, Daemon, pid_alive, wait_pid_gone
from tests.hub import Hub, Throttle, serving

COOPERATIVE = {"EXOD_DOUBLE": "cooperative"}  # a runner that loads nothing: the download is tested


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_model_factory: Callable[..., Path]
           ) -> Iterator[tuple[Hub, Throttle, dict[str, str]]]:
    with serving(tmp_path_factory.mktemp("hub"), tiny_model_factory) as it:
        yield it


@pytest.fixture
def hub(served: tuple[Hub, Throttle, dict[str, str]]) -> tuple[Hub, dict[str, str]]:
    return served[0], served[2]


@pytest.fixture
def throttle(served: tuple[Hub, Throttle, dict[str, str]]) -> Iterator[Throttle]:
    t = served[1]
    t.rate, t.connections, t.bytes = None, 0, 0
    yield t
    t.rate = None
    if t.is_down:
        t.up()


def hub_daemon(daemons: Callable[..., Daemon], cache: Path, url: str,
               instances: dict[str, Any], **hub_keys: Any) -> Daemon:
    return daemons({"hub": {"cache": str(cache), "stall_after": "30s", **hub_keys},
                    "defaults": {"stop": {"grace": "10s"}}, "instances": instances},
                   env={"HF_ENDPOINT": url})


def blob_of(cache: Path, commit: str, name: str = "model.safetensors") -> Path:
    return (cache / "models--org--tiny" / "snapshots" / commit / name).resolve()


def test_first_start_downloads_with_progress_then_loads_and_serves(
        daemons: Callable[..., Daemon], hub: tuple[Hub, dict[str, str]], throttle: Throttle,
        tmp_path: Path) -> None:
    _, commits = hub
    throttle.rate = 400_000  # ~9 s for the model: progress is seen several times
    cache = tmp_path / "cache"
    d = hub_daemon(daemons, cache, throttle.url, {
        "a": {"model": "hf:org/tiny"},
        "b": {"model": {"repo": "org/tiny"}, "env": COOPERATIVE},
    }).start()
    seen = d.until_instance("a", lambda i: i["state"] == "downloading" and "B/s)" in i["detail"]
                            and i["download"]["done_bytes"] > 0, what="download progress")
    assert seen["detail"].startswith("downloading ") and "% " in seen["detail"].replace(
        "%,", "% "), seen["detail"]
    assert seen["download"]["total_bytes"] > 3_000_000
    status = d.ctl("status").stdout
    assert "downloading" in status and "B/s" in status, status
    assert any("downloading" in f.get("STATUS", "") for f in d.listener.fields())
    metrics = urllib.request.urlopen(f"{d.api_url()}/metrics", timeout=30).read().decode()
    assert 'exod_download_total_bytes{instance="a"}' in metrics
    d.until_state("a", "ready")
    d.until_state("b", "ready")
    # Both instances named the repository: one fetcher served them.
    assert len(d.events(event="download", repo="org/tiny")) >= 1
    assert sum("fetching" in r["message"] for r in d.events(event="download")) == 1
    a = d.instance("a")
    assert a["model"] == str(cache / "models--org--tiny" / "snapshots" / commits["v2"])
    reply = json.loads(urllib.request.urlopen(urllib.request.Request(
        f"{d.api_url()}/v1/completions", json.dumps(
            {"model": "a", "prompt": "def", "max_tokens": 4}).encode(),
        {"Content-Type": "application/json"}), timeout=60).read())
    assert reply["usage"]["completion_tokens"] >= 1
    assert d.terminate() == 0

    # Offline: the cached model starts without a single request; a missing one fails, saying why.
    before = throttle.connections
    off = hub_daemon(daemons, cache, throttle.url, {
        "a": {"model": "hf:org/tiny", "env": COOPERATIVE},
        "gone": {"model": "hf:org/nope"}}, offline=True).start()
    off.until_state("a", "ready")
    gone = off.until_state("gone", "failed")
    assert "hf:org/nope is not in the cache" in gone["detail"] and "offline" in gone["detail"]
    assert "\n" not in gone["detail"]
    assert throttle.connections == before


def test_no_network_a_missing_model_fails_at_once_then_start_or_reload_fetches_it(
        daemons: Callable[..., Daemon], hub: tuple[Hub, dict[str, str]], throttle: Throttle,
        tmp_path: Path) -> None:
    _, commits = hub
    throttle.down()
    d = hub_daemon(daemons, tmp_path / "cache", throttle.url, {
        "a": {"model": "hf:org/tiny", "env": COOPERATIVE},
        "b": {"model": f"hf:org/tiny@{commits['v1']}", "env": COOPERATIVE}}).start()
    for name in ("a", "b"):
        detail = d.until_state(name, "failed")["detail"]
        assert "cannot be reached" in detail and "not in the cache" in detail, detail
        assert "\n" not in detail
    assert not [r for r in d.events(event="download") if "retrying" in r["message"]]
    throttle.up()
    d.ctl("start", "a")
    d.until_state("a", "ready")
    assert d.instance("b")["state"] == "failed"
    d.ctl("reload")  # b's config is unchanged: its fetch is tried again
    d.until_state("b", "ready")
    # The network gone again, a cached model starts with no request: a restart is enough. So
    # does one huggingface_hub fetched (mlx-lm's way: no record of exod's), from its blobs.
    throttle.down()
    d.ctl("restart", "a")
    d.until_state("a", "ready")
    shutil.rmtree(tmp_path / "cache" / "models--org--tiny" / "exod")
    d.ctl("restart", "a")
    d.until_state("a", "ready")
    assert (tmp_path / "cache" / "models--org--tiny" / "exod").is_dir()  # checked, recorded


def test_stop_mid_download_at_rung_1_then_resume_after_kill_9(
        daemons: Callable[..., Daemon], hub: tuple[Hub, dict[str, str]], throttle: Throttle,
        tmp_path: Path) -> None:
    throttle.rate = 150_000
    cache = tmp_path / "cache"
    d = hub_daemon(daemons, cache, throttle.url, {"a": {"model": "hf:org/tiny",
                                                        "env": COOPERATIVE}}).start()
    d.until_instance("a", lambda i: (i["download"] or {}).get("done_bytes", 0) > 300_000,
                     what="bytes on disk")
    d.ctl("stop", "a")
    assert d.instance("a")["state"] == "stopped"
    ladder = [r["message"] for r in d.events(event="ladder", repo="org/tiny")]
    assert ladder and all("SIGTERM" not in m and "SIGKILL" not in m for m in ladder), ladder
    partial = list((cache / "models--org--tiny" / "blobs").glob("*.incomplete"))
    assert partial and partial[0].stat().st_size > 0

    d.ctl("start", "a")
    fetcher = d.until_instance("a", lambda i: (i["download"] or {}).get("pid") is not None and
                               i["download"]["done_bytes"] > 600_000, what="the download again")
    pid = fetcher["download"]["pid"]
    assert d.proc is not None
    os.kill(d.proc.pid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
    d.proc.wait(30)
    assert wait_pid_gone(pid)
    (part,) = (cache / "models--org--tiny" / "blobs").glob("*.incomplete")
    kept = part.stat().st_size
    assert kept > 300_000

    throttle.rate = None
    again = hub_daemon(daemons, cache, throttle.url, {"a": {"model": "hf:org/tiny",
                                                            "env": COOPERATIVE}}).start()
    ready = again.until_state("a", "ready")
    # Resumed: the rest was asked for from where the partial file ends (olah serving a local
    # mirror answers a range with the whole file; the fetcher then keeps what it has and
    # writes only what follows), and the whole matches the hub's hash.
    assert f"bytes={kept}-" in throttle.ranges, throttle.ranges
    blob = blob_of(cache, ready["model"].rsplit("/", 1)[1])
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
    assert not pid_alive(pid)


def test_a_corrupted_byte_is_caught_and_fetched_again(
        daemons: Callable[..., Daemon], hub: tuple[Hub, dict[str, str]], throttle: Throttle,
        tmp_path: Path) -> None:
    _, commits = hub
    cache = tmp_path / "cache"
    ref = f"hf:org/tiny@{commits['v1']}"
    d = hub_daemon(daemons, cache, throttle.url, {"a": {"model": ref, "env": COOPERATIVE}})
    d.start()
    d.until_state("a", "ready")
    d.ctl("stop", "a")
    blob = blob_of(cache, commits["v1"])
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.write_bytes(data)
    d.ctl("start", "a")
    d.until_state("a", "ready")
    assert "does not match the hub's hash: fetching it again" in d.log_text()
    assert hashlib.sha256(blob_of(cache, commits["v1"]).read_bytes()).hexdigest() == blob.name


def test_a_repository_too_big_for_the_disk_is_refused_before_the_first_byte(
        daemons: Callable[..., Daemon], hub: tuple[Hub, dict[str, str]], throttle: Throttle,
        tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    d = hub_daemon(daemons, cache, throttle.url, {"big": {"model": "hf:org/huge"}}).start()
    failed = d.until_state("big", "failed")
    assert "not enough disk space for hf:org/huge" in failed["detail"], failed
    assert "still to download" in failed["detail"] and "free on" in failed["detail"]
    assert not list(cache.glob("models--org--huge/blobs/*"))


def test_a_reload_to_a_new_revision_fetches_it_before_replacing_the_instance(
        daemons: Callable[..., Daemon], hub: tuple[Hub, dict[str, str]], throttle: Throttle,
        tmp_path: Path) -> None:
    _, commits = hub
    cache = tmp_path / "cache"
    d = hub_daemon(daemons, cache, throttle.url, {"a": {
        "model": {"repo": "org/tiny", "revision": commits["v1"]}, "env": COOPERATIVE}}).start()
    first = d.until_state("a", "ready")
    assert first["model"].endswith(commits["v1"])
    throttle.rate = 1_000_000
    config = yaml_config(d)
    config["instances"]["a"]["model"]["revision"] = commits["v2"]
    d.write_config(config)
    d.ctl("reload")
    # The old revision serves while the new one downloads.
    d.watch_until(lambda s: any("fetching" in r["message"] for r in d.events(event="download"))
                  and s["instances"][0]["state"] == "ready", what="download during service")
    d.until_instance("a", lambda i: i["state"] == "ready" and i["model"].endswith(commits["v2"]),
                     what="the new revision")
    states = [r["message"] for r in d.events(instance="a", event="state")]
    after = states[states.index("ready → stopping (stop requested)"):]
    assert not any("downloading" in m for m in after), states


def test_a_reload_to_a_revision_that_cannot_be_fetched_keeps_the_instance_serving(
        daemons: Callable[..., Daemon], hub: tuple[Hub, dict[str, str]], throttle: Throttle,
        tmp_path: Path) -> None:
    """A running instance is never taken down by a reload for a model it cannot have: it keeps
    serving its revision, and the daemon's STATUS says why until a reload succeeds."""
    _, commits = hub
    d = hub_daemon(daemons, tmp_path / "cache", throttle.url, {"a": {
        "model": {"repo": "org/tiny", "revision": commits["v1"]}, "env": COOPERATIVE}}).start()
    first = d.until_state("a", "ready")
    config = yaml_config(d)
    config["instances"]["a"]["model"]["revision"] = "no-such-branch"
    d.write_config(config)
    d.ctl("reload")
    snap = d.watch_until(lambda s: "keeps serving its previous model" in s["daemon"]["summary"],
                         what="the failed fetch in STATUS")
    assert "org/tiny@no-such-branch" in snap["daemon"]["summary"], snap["daemon"]
    now = d.instance("a")
    assert now["state"] == "ready" and now["model"] == first["model"], now
    assert [r["pid"] for r in now["ranks"]] == [r["pid"] for r in first["ranks"]]
    states = [r["message"] for r in d.events(instance="a", event="state")]
    assert not any("stopping" in m for m in states), states


def test_a_reload_to_a_new_draft_revision_fetches_it_before_replacing_the_instance(
        daemons: Callable[..., Daemon], hub: tuple[Hub, dict[str, str]], throttle: Throttle,
        tmp_path: Path) -> None:
    _, commits = hub
    cache = tmp_path / "cache"
    model = {"repo": "org/tiny", "revision": commits["v1"]}
    d = hub_daemon(daemons, cache, throttle.url, {"a": {
        "model": model, "draft_model": f"hf:org/tiny@{commits['v1']}",
        "env": COOPERATIVE}}).start()
    d.until_state("a", "ready")
    throttle.rate = 1_000_000
    config = yaml_config(d)
    config["instances"]["a"]["draft_model"] = f"hf:org/tiny@{commits['v2']}"
    d.write_config(config)
    d.ctl("reload")
    d.watch_until(lambda s: any(f"fetching hf:org/tiny@{commits['v2']}" in r["message"]
                                for r in d.events(event="download"))
                  and s["instances"][0]["state"] == "ready", what="download during service")
    d.watch_until(lambda s: any("ready → stopping" in r["message"]
                                for r in d.events(instance="a", event="state"))
                  and s["instances"][0]["state"] == "ready", what="the replacement ready")
    states = [r["message"] for r in d.events(instance="a", event="state")]
    after = states[states.index("ready → stopping (stop requested)"):]
    assert not any("downloading" in m for m in after), states


def test_a_draft_model_by_name_is_fetched_after_the_model_then_drafts(
        daemons: Callable[..., Daemon], hub: tuple[Hub, dict[str, str]], throttle: Throttle,
        tmp_path: Path, tiny_model: Path) -> None:
    """Speculative decoding with both models named on the hub: the model, then its draft (the
    next commit, of the same tokenizer), each fetched as a model is; the answer is the model's
    own, as a plain instance of the same files gives it."""
    _, commits = hub
    cache = tmp_path / "cache"
    d = hub_daemon(daemons, cache, throttle.url, {
        "spec": {"model": f"hf:org/tiny@{commits['v1']}", "draft_model": "hf:org/tiny",
                 "num_draft_tokens": 2},
        "plain": {"model": str(tiny_model)},
    }).start()
    d.until_state("spec", "ready")
    d.until_state("plain", "ready")
    fetched = [r["message"] for r in d.events(event="download")]
    assert len([m for m in fetched if "fetching" in m]) >= 2, fetched
    assert d.instance("spec")["model"].endswith(commits["v1"])
    client = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0,
                           timeout=120)
    answers = [client.completions.create(model=name, prompt="def fib(n):", max_tokens=24,
                                         temperature=0).choices[0].text
               for name in ("spec", "plain")]
    assert answers[0] == answers[1] and answers[0], answers
    # The draft drafted (its batch speculates: the status counts the drafts it checked).
    d.until_instance("spec", lambda i: ((i["serving"] or {}).get("speculative") or {}).get(
        "drafted", 0) > 0, what="speculative decoding in status")


def yaml_config(d: Daemon) -> dict[str, Any]:
    import yaml

    data: dict[str, Any] = yaml.safe_load(d.config_path.read_text())
    return data


def test_check_pull_list_and_remove_without_any_instance_running(
        daemons: Callable[..., Daemon], hub: tuple[Hub, dict[str, str]], throttle: Throttle,
        tmp_path: Path) -> None:
    _, commits = hub
    cache = tmp_path / "cache"
    d = hub_daemon(daemons, cache, throttle.url, {"a": {"model": "hf:org/tiny",
                                                        "autostart": False, "env": COOPERATIVE}})
    env = {**os.environ, "HF_ENDPOINT": throttle.url}
    check = subprocess.run([*EXOD, "check", "-c", str(d.config_path)], env=env,
                           capture_output=True, text=True, timeout=120, check=True).stdout
    first = re.search(r"a: hf:org/tiny: not in the cache; fetched at its first start: "
                      r"([\d.]+MiB) \(commit ", check)
    assert first is not None, check  # about 3.5 MB
    size = first[1]
    assert "fits on disk" in check and throttle.bytes < 100_000  # sizes only, no weights
    assert f"its files ({size}) fit in the memory available now" in check, check
    d.start()
    pulled = d.ctl("pull", "hf:org/tiny").stdout
    assert f"commit {commits['v2']}" in pulled
    listed = d.ctl("models").stdout
    assert "hf:org/tiny" in listed and "main=" in listed and "a (stopped)" in listed, listed
    check = subprocess.run([*EXOD, "check", "-c", str(d.config_path)], env=env,
                           capture_output=True, text=True, timeout=120, check=True).stdout
    assert f"a: hf:org/tiny: cached ({size}, commit {commits['v2'][:12]})" in check, check
    assert "a: needs " in check  # the memory estimate, from the cached snapshot
    assert d.ctl("rm", "hf:org/tiny").returncode == 0
    assert not (cache / "models--org--tiny").exists()

    # What huggingface_hub (mlx-lm) already downloaded into a shared cache is not fetched again:
    # it is checked against the hub's hashes, and used.
    subprocess.run([sys.executable, "-c", "import sys; from huggingface_hub import "
                    "snapshot_download as s; s('org/tiny', cache_dir=sys.argv[1])", str(cache)],
                   env=env, check=True, capture_output=True, timeout=120)
    before = throttle.bytes
    d.ctl("start", "a")
    d.until_state("a", "ready")
    assert throttle.bytes - before < 100_000, throttle.bytes - before
