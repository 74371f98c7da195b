"""Strange caches through real daemons: the hub cache by Ollama's `DELETE /api/delete`, `exoctl
rm` and `exoctl models`, and the prompt cache by a real runner's start and `exoctl cache clear`.
A link out of the cache, a FIFO, a file where a folder should be, a file that cannot be removed
(chattr +i) and folders the daemon cannot read (a daemon run as nobody): each a clear 4xx or a
line that says what was done, never a 500 nor a closed connection, and nothing outside the cache
followed or removed. Then two daemons that share a `prompt_cache_dir` keep each other's entries.

One daemon for the hub and clear tests (no runner), one real runner start of the tiny model for
the prompt cache's start-up, two pairs of daemons with a runner each for the shared folder (of
two config files, and of one): ~30 CPU-s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from exod import cache_files
from exod.paths import daemon_id
from tests.harness import EXOCTL, Daemon
from tests.immutable import immutable_files

COMMIT = "c" * 40
NOBODY = "65534"
AS_NOBODY = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
EOS = "2"  # the tiny model's end token: banned, every answer has max_tokens tokens


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("strange")
    daemon = Daemon({"hub": {"cache": str(root / "hub"), "offline": True},
                     "defaults": {"prompt_cache_dir": str(root / "pc")},
                     "instances": {"t": {"model": str(tiny_model), "autostart": False}}},
                    name="strange")
    (root / "hub").mkdir()
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.close()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Out of every cache: a repository's look-alike, and a file a link will point at."""
    where = tmp_path / "outside"
    (where / "refs").mkdir(parents=True)
    (where / "refs" / "main").write_text(COMMIT)
    (where / "blobs").mkdir()
    (where / "blobs" / "b").write_bytes(b"w" * 5000)
    (where / "precious").write_bytes(b"p" * 1000)
    return where


def untouched(outside: Path) -> bool:
    return (outside / "precious").read_bytes() == b"p" * 1000 and \
        (outside / "blobs" / "b").stat().st_size == 5000


@pytest.fixture
def immutable() -> Iterator[Callable[[Path], None]]:
    """Make a file that even root cannot remove (chattr +i), undone after the test."""
    with immutable_files() as make:
        yield make


def hub(d: Daemon) -> Path:
    return Path(json.loads(d.ctl("models", "--json").stdout)["cache"])


def delete(d: Daemon, name: str) -> tuple[int, dict[str, Any] | None]:
    """DELETE /api/delete as Ollama's clients send it: (status, the JSON answer if any)."""
    req = urllib.request.Request(d.api_url() + "/api/delete", method="DELETE",
                                 data=json.dumps({"model": name}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            body = r.read()
            return r.status, json.loads(body) if body else None
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, {"raw": body.decode(errors="replace")}


def said(d: Daemon, needle: str) -> list[str]:
    return [rec["message"] for rec in d.events() if needle in rec["message"]]


# ---- the hub cache ---------------------------------------------------------------------------
def test_a_linked_repository_is_listed_and_deleted_as_a_link(d: Daemon, outside: Path) -> None:
    cache = hub(d)
    link = cache / "models--evil--link"
    link.symlink_to(outside)
    listed = d.ctl("models").stdout
    row = next(x for x in listed.splitlines() if x.startswith("hf:evil/link"))
    assert "is a symlink to" in row and str(outside) in row, listed
    status, body = delete(d, "evil/link")
    assert status == 200 and body is None, (status, body)
    assert not link.is_symlink() and untouched(outside)
    line = said(d, "hub cache: evil/link: removed the symlink")
    assert line and str(outside) in line[0] and "not followed" in line[0]
    assert delete(d, "evil/link")[0] == 404  # gone: nothing there now

    link.symlink_to(outside)
    out = d.ctl("rm", "hf:evil/link")
    assert out.stdout.startswith(f"evil/link: removed the symlink {link} (to {outside}:"), out
    assert not link.is_symlink() and untouched(outside)


@pytest.mark.parametrize("kind", ["fifo", "file"])
def test_a_fifo_or_a_file_in_place_of_a_repository(d: Daemon, kind: str) -> None:
    cache = hub(d)
    path = cache / f"models--odd--{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text("not a folder")
    listed = d.ctl("models", timeout=30).stdout
    assert f"is a {'FIFO' if kind == 'fifo' else 'file'}, not a folder" in listed, listed
    status, _ = delete(d, f"odd/{kind}")
    assert status == 200 and not path.exists()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text("again")
    out = d.ctl("rm", f"hf:odd/{kind}")
    assert f"({'a FIFO' if kind == 'fifo' else 'a file'})" in out.stdout and not path.exists()


def test_a_fifo_and_a_folder_where_files_should_be(d: Daemon) -> None:
    repo = hub(d) / "models--odd--inside"
    (repo / "refs").mkdir(parents=True)
    os.mkfifo(repo / "refs" / "main")  # read as a ref, it would block the daemon
    (repo / "refs" / "pr").mkdir()
    (repo / "blobs").mkdir()
    (repo / "blobs" / "x").mkdir()  # a folder where a blob should be
    listed = d.ctl("models", timeout=30).stdout
    assert "hf:odd/inside" in listed, listed
    out = d.ctl("rm", "hf:odd/inside", timeout=30)
    assert out.stdout.startswith(f"odd/inside: removed {repo} (") and not repo.exists()


def test_a_repository_that_cannot_be_removed_is_a_409_and_a_failure(
        d: Daemon, immutable: Callable[[Path], None]) -> None:
    repo = hub(d) / "models--stuck--one"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "gone").write_bytes(b"g" * 100)
    (repo / "blobs" / "stays").write_bytes(b"s" * 10)
    immutable(repo / "blobs" / "stays")
    status, body = delete(d, "stuck/one")
    assert status == 409 and body is not None, (status, body)
    message = body["error"] if isinstance(body["error"], str) else body["error"]["message"]
    assert "cannot delete all of stuck/one" in message and "Operation not permitted" in message
    assert "blobs/stays" in message
    out = d.ctl("rm", "hf:stuck/one", check=False)
    assert out.returncode == 1 and "closed the connection" not in out.stderr, out
    assert "cannot remove all of stuck/one" in out.stderr and "blobs/stays" in out.stderr, out
    assert said(d, "hub cache: stuck/one: removed 100B of")


def test_a_daemon_that_cannot_read_its_cache_says_so(tmp_path_factory: pytest.TempPathFactory,
                                                     daemons: Callable[..., Daemon]) -> None:
    """The daemon runs as nobody; a repository in its cache is root's, 0700."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run a daemon as another user")
    top = Path(tempfile.mkdtemp(prefix="exod-nobody-"))
    top.chmod(0o755)
    try:
        cache = top / "hub"
        repo = cache / "models--root--private"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(COMMIT)
        os.chown(cache, int(NOBODY), int(NOBODY))
        repo.chmod(0o700)
        nd = daemons({"hub": {"cache": str(cache), "offline": True}, "instances": {}},
                     name="nobody")
        for p in [nd.dir, *nd.dir.rglob("*")]:
            os.chown(p, int(NOBODY), int(NOBODY))
        nd.dir.chmod(0o755)
        nd.start(prefix=AS_NOBODY)

        def ctl(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*AS_NOBODY, *EXOCTL, "--socket", str(nd.socket), *args],
                                  capture_output=True, text=True, timeout=60, check=False)

        listed = ctl("models")
        assert listed.returncode == 0 and "cannot be read (Permission denied)" in listed.stdout, \
            listed
        out = ctl("rm", "hf:root/private")
        assert out.returncode == 1 and "Permission denied" in out.stderr, out
        assert "closed the connection" not in out.stderr and repo.exists()
        status, body = delete(nd, "root/private")
        assert status == 409 and body is not None and "Permission denied" in json.dumps(body)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def as_nobody(fn: Callable[[], Any]) -> Any:
    """`fn()` in a child process that runs as user nobody: its JSON-able result."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover -- the child
        os.close(r)
        code = 0
        try:
            os.setgroups([])
            os.setgid(int(NOBODY))
            os.setuid(int(NOBODY))
            out = json.dumps({"ok": fn()})
        except BaseException as e:  # noqa: BLE001 -- reported to the parent
            out, code = json.dumps({"error": f"{type(e).__name__}: {e}"}), 1
        os.write(w, out.encode())
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = json.loads(f.read() or b'{"error": "no answer"}')
    os.waitpid(pid, 0)
    assert "error" not in got, got["error"]
    return got["ok"]


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder another user may enter (pytest's own are root's alone)."""
    where = Path(tempfile.mkdtemp(prefix="exod-strange-"))
    where.chmod(0o755)
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_a_folder_another_user_owns_is_said_not_removed(shared_tmp: Path) -> None:
    top = shared_tmp / "cache"
    (top / "locked").mkdir(parents=True)
    (top / "locked" / "f").write_text("x")
    os.chown(top, int(NOBODY), int(NOBODY))
    (top / "locked").chmod(0o700)  # root's, inside nobody's folder
    done = as_nobody(lambda: (lambda r: [r.found, r.whole, r.text()])(
        cache_files.remove(top / "locked")))
    assert done[:2] == [True, False] and "Permission denied" in done[2], done
    assert (top / "locked" / "f").exists()


def test_a_prompt_cache_folder_a_runner_cannot_read_turns_its_tier_off(shared_tmp: Path) -> None:
    from exod.runner.prompt_cache import fingerprint as fp
    from exod.runner.prompt_cache.disk import DiskTier

    model = shared_tmp / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w")
    root = shared_tmp / "pc"
    (root / "rank0").mkdir(parents=True)
    os.chown(root, int(NOBODY), int(NOBODY))  # the instance's folder is nobody's, its rank's root's

    def run() -> list[Any]:
        tier = DiskTier(root, 0, 1 << 20)
        tier.open({"format": fp.FORMAT_VERSION}, fp.weight_files(model, None))
        tier.writer.drain(time.monotonic() + 30)
        return [tier.ready, tier.state]

    ready, state = as_nobody(run)
    assert not ready and state.startswith("off: cannot open") and "Permission denied" in state


# ---- the prompt cache ------------------------------------------------------------------------
def folder_of(d: Daemon, name: str) -> Path:
    """The instance's own folder: DIR/ID/NAME, ID this daemon's (its config file's)."""
    import yaml

    cfg = yaml.safe_load(d.config_path.read_text())
    return Path(cfg["defaults"]["prompt_cache_dir"]) / daemon_id(d.config_path) / name


def test_clearing_a_stopped_instance_removes_links_as_links(d: Daemon, outside: Path) -> None:
    folder = folder_of(d, "t")
    (folder / "rank0" / ("a" * 32)).mkdir(parents=True)
    (folder / "rank0" / ("a" * 32) / "e.safetensors").write_bytes(b"x" * 2048)
    (folder / "rank1").symlink_to(outside)
    out = d.ctl("cache", "clear", "t").stdout.splitlines()
    assert out[0] == "t: not running; 2KiB removed from disk", out
    assert out[1].strip().startswith(f"removed the symlink {folder / 'rank1'} (to {outside}:")
    assert untouched(outside) and not list(folder.glob("rank*"))


def test_a_runner_starting_over_a_strange_folder_says_what_it_removed(
        d: Daemon, outside: Path) -> None:
    folder = folder_of(d, "t")
    stale = folder / "rank0" / ("e" * 32)
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.symlink_to(outside)  # named as a folder of other weights or settings
    os.mkfifo(folder / "weights.json")
    d.ctl("start", "t")
    d.until_instance("t", lambda i: (((i["serving"] or {}).get("prompt_cache") or {}).get(
        "disk") or {}).get("state") == "ready", what="t's disk tier open")
    assert untouched(outside) and not stale.is_symlink()
    lines = [rec["message"] for rec in d.events(instance="t") if "prompt cache" in rec["message"]]
    link = [x for x in lines if "removed the symlink" in x]
    assert link and str(outside) in link[0] and "not followed" in link[0], lines
    assert not any("MiB in" in x for x in lines), lines  # no folder was, none is said to be
    d.ctl("stop", "t")


# ---- a shared prompt_cache_dir ---------------------------------------------------------------
def long_prompt(seed: str) -> str:
    words = "the quick brown fox jumps over the lazy dog and reads its tools ".split()
    return seed + ": " + " ".join(words[(i * 7 + len(seed)) % len(words)] for i in range(300))


def chat(d: Daemon, content: str) -> tuple[str, int, int]:
    """(answer, prompt tokens, cached tokens), greedy and of a fixed length."""
    c = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0, timeout=300)
    r = c.chat.completions.create(model="t", messages=[{"role": "user", "content": content}],
                                  max_tokens=4, temperature=0, logit_bias={EOS: -100})
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    return (r.choices[0].message.content or "", r.usage.prompt_tokens,
            r.usage.prompt_tokens_details.cached_tokens or 0)


def on_disk(d: Daemon, entries: int) -> None:
    d.until_instance("t", lambda i: (((i.get("serving") or {}).get("prompt_cache") or {}).get(
        "disk") or {}).get("entries") == entries, what=f"{entries} entries of t on disk")


def test_two_daemons_sharing_a_prompt_cache_dir_keep_each_others_entries(
        daemons: Callable[..., Daemon], tiny_model: Path,
        tiny_model_factory: Callable[..., Path], tmp_path: Path) -> None:
    """Two daemons, an instance `t` each, of other weights, in one prompt_cache_dir: a restart
    of either removes nothing of the other's, and each hits its own entries after it."""
    shared = tmp_path / "shared"
    a = daemons({"ready": "instances", "defaults": {"prompt_cache_dir": str(shared)},
                 "instances": {"t": {"model": str(tiny_model)}}}, name="share-a")
    b = daemons({"ready": "instances", "defaults": {"prompt_cache_dir": str(shared)},
                 "instances": {"t": {"model": str(tiny_model_factory(seed=7))}}},
                name="share-b")
    a.start()
    b.start()
    prompt = long_prompt("shared")
    cold = {}
    for d in (a, b):
        cold[d.dir] = chat(d, prompt)
        assert cold[d.dir][2] == 0
        on_disk(d, 1)  # written while idle
    folders = {d.dir: shared / daemon_id(d.config_path) / "t" for d in (a, b)}
    assert len(set(folders.values())) == 2
    files = {d.dir: sorted(folders[d.dir].glob("rank0/*/*.safetensors")) for d in (a, b)}
    assert all(len(f) == 1 for f in files.values()), files
    for restarted, other in ((a, b), (b, a)):
        assert restarted.terminate() == 0
        restarted.start()
        text, n, cached = cold[restarted.dir]
        assert chat(restarted, prompt) == (text, n, n - 1)  # loaded from its own folder
        assert files[other.dir][0].exists(), f"{other.dir}'s entry went at the other's start"
        assert other.instance("t")["serving"]["prompt_cache"]["disk"]["entries"] == 1
    for d in (a, b):  # each one's entry was a hit after its restart: served from its disk
        disk = d.instance("t")["serving"]["prompt_cache"]["disk"]
        assert disk["hits"] >= 1 and disk["errors"] == 0, disk
        assert not [rec for rec in d.events() if "kept for other weights" in rec["message"]]
        lock = (folders[d.dir].parent / ".lock").read_text()
        assert f"config {d.config_path}" in lock


def test_a_second_daemon_of_the_same_config_file_keeps_no_disk_tier_there(
        daemons: Callable[..., Daemon], tiny_model: Path, tmp_path: Path) -> None:
    """One config file, two daemons (each its own runtime folder): the second finds the first's
    folder locked, serves without a disk tier and removes nothing; once the first is gone, a
    reload gives the folder to the second, whose restart then loads the first one's entry."""
    shared = tmp_path / "shared"
    config = {"control": {}, "ready": "instances", "defaults": {"prompt_cache_dir": str(shared)},
              "instances": {"t": {"model": str(tiny_model)}}}
    a, b = (daemons(config, env={"RUNTIME_DIRECTORY": str(tmp_path / f"run-{x}")},
                    name=f"same-{x}") for x in "ab")
    for d, x in ((a, "a"), (b, "b")):
        d.socket = tmp_path / f"run-{x}" / "control.sock"
    b.config_path = a.config_path  # started from the first one's file
    a.start()
    prompt = long_prompt("same config")
    text, n, _ = chat(a, prompt)
    on_disk(a, 1)
    (entry,) = (shared / daemon_id(a.config_path) / "t").glob("rank0/*/*.safetensors")
    b.start()
    assert a.proc is not None
    busy = [rec["message"] for rec in b.events() if "is in use by another exod" in
            rec["message"]]
    assert busy and f"(pid {a.proc.pid}, config {a.config_path})" in busy[0], busy
    assert chat(b, prompt) == (text, n, 0) and entry.exists()
    served = b.until_instance("t", lambda i: (i["serving"] or {}).get("prompt_cache") is not None,
                              what="b's prompt cache figures")
    assert served["serving"]["prompt_cache"]["disk"] is None  # no disk tier, said in its log
    assert a.instance("t")["serving"]["prompt_cache"]["disk"]["entries"] == 1
    assert a.terminate() == 0
    b.ctl("reload")
    b.ctl("restart", "t")
    b.until_state("t", "ready")
    assert chat(b, prompt) == (text, n, n - 1)  # the first one's entry, now its own
