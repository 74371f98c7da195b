"""Models named by hub repository, the pure parts: names, the cache layout, hash checks, the
progress line, and downloads supervised through a fake seam (shared, stopped at rung 1,
retried on a stall or a network error, never timed out, refused with the reason)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from exod.wire import control as cm
from exod.wire import messages as m
from exod.cli.pull_view import PullView
from exod.config.schema import Instance
from exod.core.exits import EXIT_TEMPFAIL, EXIT_UNAVAILABLE
from exod.core.shards import pipeline_shards
from exod.core.states import State
from exod.daemon.instance import InstanceRuntime
from exod.hub import cache as hc
from exod.core import hub_ref
from exod.hub.fetch import FetchJob
from exod.hub.fetch import main as fetch_main
from exod.hub.files import disk_problem, progress_text, wanted
from exod.hub.verify import digest
from tests.unit.fakes import ASK, FakeSeam

REF = hub_ref.HubRef("org/tiny")
COMMIT = "a" * 40


# ---- names ------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "repo", "revision"), [
    ("hf:org/tiny", "org/tiny", "main"),
    ("hf:mlx-community/Qwen3-8B-4bit@v1.0", "mlx-community/Qwen3-8B-4bit", "v1.0"),
    (f"hf:org/tiny@{COMMIT}", "org/tiny", COMMIT),
])
def test_names_parse(text: str, repo: str, revision: str) -> None:
    ref = hub_ref.parse(text)
    assert (ref.repo, ref.revision) == (repo, revision)
    assert hub_ref.parse(str(ref)) == ref
    assert ref.pinned == (revision == COMMIT)


@pytest.mark.parametrize("text", ["hf:tiny", "hf:org/../x", "hf:org/tiny@", "hf:org/ti ny",
                                  "hf:/tiny", "hf:org/tiny@a..b", "hf:a/b/c"])
def test_bad_names_are_refused_with_a_reason(text: str) -> None:
    with pytest.raises(ValueError, match="not a"):
        hub_ref.parse(text)


def test_the_cache_folder_is_huggingface_hubs() -> None:
    assert hub_ref.parse("hf:mlx-community/Qwen3-8B").folder == "models--mlx-community--Qwen3-8B"


def test_default_cache_user_shares_hf_system_keeps_its_own() -> None:
    home = Path.home()
    assert hc.default_cache({}, 1000) == home / ".cache" / "huggingface" / "hub"
    assert hc.default_cache({"HF_HOME": "/h"}, 1000) == Path("/h/hub")
    assert hc.default_cache({"STATE_DIRECTORY": "/var/lib/exod"}, 990) == Path(
        "/var/lib/exod/hub")
    assert hc.default_cache({}, 0) == Path("/var/lib/exod/hub")
    assert hc.default_cache({"HF_HUB_CACHE": "/c", "STATE_DIRECTORY": "/s"}, 0) == Path("/c")
    # An explicit HF_HOME is meant, root's in a terminal too (as huggingface_hub reads it).
    assert hc.default_cache({"HF_HOME": "/h"}, 0) == Path("/h/hub")


# ---- files and progress -------------------------------------------------------------------
def test_only_what_a_runner_needs_is_fetched_never_code() -> None:
    assert all(wanted(n) for n in ("model-00001-of-00002.safetensors", "config.json",
                                   "tokenizer.json", "chat_template.jinja", "tokenizer.model"))
    assert not any(wanted(n) for n in ("modeling_x.py", "original/consolidated.pth",
                                       "sub/model.safetensors", "README.md", "model.bin"))


def test_progress_line() -> None:
    assert progress_text(1_210_000_000, 4_500_000_000, 38e6) == \
        "downloading 1.1GiB of 4.2GiB (26%, 36.2MiB/s)"
    assert progress_text(500_000, 3_400_000, 400e3) == \
        "downloading 488.3KiB of 3.2MiB (14%, 390.6KiB/s)"
    assert progress_text(10, 10, None, "verifying") == "verifying 10B of 10B (100%)"


def test_disk_refusal_gives_the_figures() -> None:
    assert disk_problem("hf:o/n", 10, 10, "/c") is None
    why = disk_problem("hf:o/n", 5 * 2**30, 2**30, "/c")
    assert why == ("not enough disk space for hf:o/n: 5GiB still to download, 1GiB free on /c")


# ---- the cache and hash checks -------------------------------------------------------------
def put(cache: Path, name: str, data: bytes, lfs: bool) -> hc.FileRecord:
    """A file in the cache as huggingface_hub lays it out, named by its hub hash."""
    if lfs:
        sha = hashlib.sha256(data).hexdigest()
        rec = hc.FileRecord(len(data), sha, sha256=sha)
    else:
        oid = subprocess.run(["git", "hash-object", "--stdin"], input=data, check=True,
                             capture_output=True).stdout.decode().strip()
        rec = hc.FileRecord(len(data), oid, git_sha1=oid)
    blob = hc.repo_dir(cache, REF) / "blobs" / rec.blob
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    link = hc.snapshot_dir(cache, REF, COMMIT) / name
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(blob, link.parent), link)
    return rec


def test_hash_checks_match_the_hubs_lfs_and_git_ids(tmp_path: Path) -> None:
    for lfs in (True, False):
        rec = put(tmp_path, f"f{lfs}", b"weights" * 1000, lfs)
        path = hc.snapshot_dir(tmp_path, REF, COMMIT) / f"f{lfs}"
        assert digest(path, rec)
        data = bytearray(path.read_bytes())
        data[3] ^= 1
        path.resolve().write_bytes(data)
        assert not digest(path, rec)


def test_a_snapshot_is_cached_once_recorded_and_checked_until_a_file_changes(
        tmp_path: Path) -> None:
    assert hc.cached(tmp_path, REF) is None
    files = {"config.json": put(tmp_path, "config.json", b"{}", False),
             "model.safetensors": put(tmp_path, "model.safetensors", b"w" * 100, True)}
    snap = hc.snapshot_dir(tmp_path, REF, COMMIT)
    manifest = hc.Manifest(COMMIT, files, {n: hc.stamp(snap / n) for n in files})  # type: ignore[misc]
    hc.write_manifest(tmp_path, REF, manifest)
    assert hc.cached(tmp_path, REF) is None  # no ref for `main` yet
    hc.write_ref(tmp_path, REF, COMMIT)
    found = hc.cached(tmp_path, REF)
    assert found == hc.Cached(snap, COMMIT, 102, True)
    blob = (snap / "model.safetensors").resolve()
    os.utime(blob, ns=(1, 1))  # rewritten in place: checked again before a runner starts
    assert hc.cached(tmp_path, REF) == hc.Cached(snap, COMMIT, 102, False)
    blob.unlink()
    assert hc.cached(tmp_path, REF) is None
    (entry,) = hc.entries(tmp_path)
    assert (entry.repo, entry.revisions, entry.commits) == ("org/tiny", {"main": COMMIT},
                                                             (COMMIT,))
    assert hc.remove(tmp_path, REF).whole and not hc.remove(tmp_path, REF).found


class Heard:
    """The fetcher's end of its channel, keeping what it says."""

    def __init__(self) -> None:
        self.said: list[object] = []

    def send(self, msg: object) -> bool:
        self.said.append(msg)
        return True


def test_a_snapshot_of_plain_files_is_taken_offline_as_mlx_lm_would_load_it(
        tmp_path: Path) -> None:
    """A cache copied with its links followed (`cp -rL`), or made on a file system without
    links: the snapshot holds plain files. Offline, exod takes them as they are (no hub to tell
    their hashes), records them, and starts from them after."""
    linked, plain = tmp_path / "linked", tmp_path / "plain"
    put(linked, "config.json", b"{}", False)
    put(linked, "model.safetensors", b"w" * 100, True)
    hc.write_ref(linked, REF, COMMIT)
    subprocess.run(["cp", "-rL", str(linked), str(plain)], check=True)
    snap = hc.snapshot_dir(plain, REF, COMMIT)
    assert not (snap / "model.safetensors").is_symlink()
    assert hc.cached(plain, REF) is None  # nothing exod recorded yet
    job = FetchJob(REF, plain, True, False, COMMIT, Heard())  # type: ignore[arg-type]
    assert fetch_main(job) == 0
    assert hc.cached(plain, REF) == hc.Cached(snap, COMMIT, 102, True)
    (entry,) = hc.entries(plain)
    assert entry.size == 2 * 102  # the blobs, and the snapshot's plain files
    (snap / "config.json").unlink()  # gone: it cannot be fetched offline, and says so
    assert hc.cached(plain, REF) is None
    assert fetch_main(job) == EXIT_UNAVAILABLE


# ---- downloads through the fake seam -------------------------------------------------------
def hub_instance(seam: FakeSeam, name: str = "a") -> InstanceRuntime:
    cfg = Instance(name=name, model=Path("hf:org/tiny"), hub=REF)
    return InstanceRuntime(cfg, pipeline_shards(4, 1), seam)


def test_two_instances_share_one_download_then_both_start(tmp_path: Path) -> None:
    seam = FakeSeam()
    a, b = hub_instance(seam, "a"), hub_instance(seam, "b")
    a.start()
    b.start()
    assert a.state is b.state is State.DOWNLOADING
    (_, pid, _), = seam.fetchers
    seam.send(pid, m.Hello(version=m.VERSION, pid=pid))
    seam.send(pid, m.DownloadProgress(done=0, total=4_500_000_000))
    seam.advance(2.0)
    seam.send(pid, m.DownloadProgress(done=76_000_000, total=4_500_000_000))
    assert a.download is not None
    assert a.download.describe(seam.now()) == "downloading 72.5MiB of 4.2GiB (1%, 36.2MiB/s)"
    seam.send(pid, m.Fetched(path=str(tmp_path), commit=COMMIT))
    seam.exit(pid, code=0)
    assert a.state is b.state is State.STARTING
    assert a.config.model == tmp_path and a.download is None
    assert [s.instance for s in seam.spawns] == ["a", "b"]


def test_a_cached_model_starts_with_no_fetcher(tmp_path: Path) -> None:
    seam = FakeSeam()
    seam.cache["org/tiny"] = tmp_path
    a = hub_instance(seam)
    a.start()
    assert a.state is State.STARTING and not seam.fetchers
    assert State.DOWNLOADING.value not in [s for _, s in seam.changes]


def test_a_stop_mid_download_asks_the_fetcher_and_ends_at_rung_1() -> None:
    seam = FakeSeam()
    a, b = hub_instance(seam, "a"), hub_instance(seam, "b")
    a.start()
    b.start()
    (_, pid, _), = seam.fetchers
    a.stop()  # b still waits: the download goes on
    assert a.state is State.STOPPED and not seam.steps(pid)
    b.stop()
    assert b.state is State.STOPPING and seam.steps(pid) == [(seam.now(), ASK)]
    seam.advance(1.0)
    seam.exit(pid, code=0)
    assert b.state is State.STOPPED and not seam.pending()


def test_a_stall_is_shown_and_retried_with_backoff_never_given_up() -> None:
    seam = FakeSeam()
    a = hub_instance(seam)
    a.start()
    for attempt in range(6):
        pid = seam.fetchers[-1][1]
        seam.send(pid, m.DownloadProgress(done=attempt + 1, total=100))
        seam.advance(60.0)  # no new byte for stall_after
        assert a.download is not None and a.download.stalled
        assert "stalled: no bytes for 1m" in a.download.describe(seam.now())
        assert seam.steps(pid)[0][1] == ASK
        seam.exit(pid, code=0)
        assert "retry" in a.download.describe(seam.now())
        seam.advance(30.0)
        assert len(seam.fetchers) == attempt + 2
    assert a.state is State.DOWNLOADING


def test_a_slow_download_is_never_timed_out() -> None:
    seam = FakeSeam()
    a = hub_instance(seam)
    a.start()
    pid = seam.fetchers[-1][1]
    for n in range(1, 200):  # a byte every 59 s: slow, but never stalled
        seam.advance(59.0)
        seam.send(pid, m.DownloadProgress(done=n, total=1000))
    assert a.state is State.DOWNLOADING and not seam.steps(pid) and len(seam.fetchers) == 1


def test_a_network_error_is_retried_a_refusal_fails_with_its_reason() -> None:
    seam = FakeSeam()
    a = hub_instance(seam)
    a.start()
    pid = seam.fetchers[-1][1]
    seam.send(pid, m.Failed(reason="hf:org/tiny: ConnectError: refused", exit_code=EXIT_TEMPFAIL))
    seam.exit(pid, code=EXIT_TEMPFAIL)
    assert a.state is State.DOWNLOADING
    seam.advance(2.0)
    pid = seam.fetchers[-1][1]
    why = "not enough disk space for hf:org/tiny: 4GiB still to download, 1GiB free on /c"
    seam.send(pid, m.Failed(reason=why, exit_code=EXIT_UNAVAILABLE))
    seam.exit(pid, code=EXIT_UNAVAILABLE)
    assert a.state is State.FAILED and a.machine.reason == why
    assert len(seam.fetchers) == 2 and not seam.pending()


class ConnectError(OSError):
    """Named as httpx's (and httpx2's) error for a connection that could not be made."""


def test_no_network_fails_a_missing_model_at_once_and_retries_a_download_under_way(
        tmp_path: Path) -> None:
    from exod.wire.child_end import ChildEnd
    from exod.hub.fetch import FetchJob, cannot_connect, unreachable

    job = FetchJob(REF, tmp_path, False, False, None, ChildEnd(None, {}, {}))
    refused = ConnectError("[Errno 111] Connection refused")
    assert cannot_connect(refused) and not cannot_connect(TimeoutError("read timed out"))
    wrapped = RuntimeError("listing failed")
    wrapped.__cause__ = refused
    assert cannot_connect(wrapped)
    why = unreachable(job, refused)
    assert why is not None and "cannot be reached" in why and "not in the cache" in why
    assert "\n" not in why
    assert unreachable(job, TimeoutError("read timed out")) is None  # bytes flowed: retried
    blobs = hc.repo_dir(tmp_path, REF) / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "abc.incomplete").touch()  # a download under way: retried with backoff
    assert unreachable(job, refused) is None


# ---- the token ---------------------------------------------------------------------------------
def test_the_token_file_must_be_private_and_no_child_inherits_a_token(tmp_path: Path) -> None:
    from exod.config import ConfigError, load_config
    from exod.daemon.spawn import runner_env

    token = tmp_path / "hf-token"
    token.write_text("hf_secret\n")
    token.chmod(0o644)
    cfg = tmp_path / "exod.yaml"
    cfg.write_text(f"control: {{socket: {tmp_path}/c.sock}}\nhub: {{hf_token_file: {token}}}\n"
                   "instances:\n  a: {model: hf:org/tiny}\n")
    with pytest.raises(ConfigError, match=r"hub.hf_token_file: .* has mode 0644: a secret "
                                          r"must be closed to other users"):
        load_config(cfg)
    token.chmod(0o600)
    loaded = load_config(cfg)
    assert loaded.hub.hf_token_file == token
    assert loaded.instances["a"].hub == REF
    env = runner_env({"HF_TOKEN": "x", "HUGGING_FACE_HUB_TOKEN": "y", "PATH": "/bin"}, {})
    assert env == {"PATH": "/bin"}


def test_exoctl_pull_draws_its_steps_as_ollama_pull_does() -> None:
    def ev(phase: str, done: int = 0, total: int = 0, rate: int | None = None,
           detail: str = "") -> cm.DownloadEvent:
        return cm.DownloadEvent(detail, phase, done, total, rate)

    tty = PullView("org/tiny", tty=True)
    tty.event(ev("starting"))
    tty.event(ev("downloading", 1_200_000_000, 4_500_000_000, 38_000_000))
    assert tty.take() == (
        "\r\033[Kpulling manifest\n\r\033[Kpulling org/tiny:  26% ▕████            ▏ "
        "1.1GiB/4.2GiB 36.2MiB/s 1m27s")
    tty.event(ev("downloading", 4_500_000_000, 4_500_000_000))
    tty.event(ev("verifying", 4_500_000_000, 4_500_000_000))
    tty.finish(ok=True)
    assert tty.take().endswith("\n\r\033[Kverifying sha256 digest 100% ▕████████████████▏\n"
                               "success\n")
    plain = PullView("org/tiny", tty=False)  # a pipe: each step's last line, once
    for e in (ev("starting"), ev("downloading", 1, 10), ev("downloading", 10, 10),
              ev("waiting", detail="downloading: stalled; retry 2 in 8s")):
        plain.event(e)
    plain.finish(ok=False)
    assert plain.take() == ("pulling manifest\npulling org/tiny: 100% ▕████████████████▏ "
                            "10B/10B\ndownloading: stalled; retry 2 in 8s\n")
