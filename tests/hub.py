"""A real hub-compatible server for tests, with no internet: olah (a self-hosted hub mirror, from
PyPI) serving git repositories made here from our tiny test models, in its offline mode (it never
reaches upstream). Weights are stored as git-LFS objects, as on the hub, so the client takes the
same path (LFS sizes and SHA-256 in the tree listing, the SHA-256 as the ETag).

`Throttle` sits between the client and olah: a TCP proxy with an adjustable rate that counts
connections and bytes, so tests can make a download slow, see whether any request was made,
and see how many bytes a resumed download fetched.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.harness import BIN, SAFETY, free_port


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


def _lfs_pointer(oid: str, size: int) -> str:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"


class Hub:
    """olah on a free port; `publish` makes (or adds a commit to) a repository it serves."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mirrors = root / "mirrors"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def publish(self, model_dir: Path, repo: str = "org/tiny",
                fake_sizes: dict[str, int] | None = None) -> str:
        """Commit `model_dir`'s files (weights as LFS objects) to `repo`; the new commit's id.
        `fake_sizes`: extra LFS files listed with these sizes and no content (a repository too
        big for the disk)."""
        work = self.mirrors / "models" / repo
        if not work.exists():
            work.mkdir(parents=True)
            _git(work, "init", "-q", "-b", "main")
        for f in sorted(model_dir.iterdir()):
            if f.name.startswith("."):
                continue
            data = f.read_bytes()
            if f.suffix == ".safetensors":
                oid = hashlib.sha256(data).hexdigest()
                obj = work / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
                obj.parent.mkdir(parents=True, exist_ok=True)
                obj.write_bytes(data)
                (work / f.name).write_text(_lfs_pointer(oid, len(data)))
            else:
                shutil.copy(f, work / f.name)
        for name, size in (fake_sizes or {}).items():
            (work / name).write_text(_lfs_pointer(hashlib.sha256(name.encode()).hexdigest(), size))
        _git(work, "add", "-A")
        _git(work, "commit", "-q", "--allow-empty", "-m", "publish")
        return _git(work, "rev-parse", "HEAD")

    def start(self, netloc: str | None = None) -> Hub:
        """`netloc`: the HOST:PORT olah names in the links it hands out (a proxy's)."""
        config = self.root / "olah.toml"
        links = f"mirror-netloc = \"{netloc}\"\nmirror-lfs-netloc = \"{netloc}\"\n" \
            if netloc else ""
        config.write_text(
            "[basic]\nhost = \"127.0.0.1\"\n" + links +
            f"port = {self.port}\nrepos-path = \"{self.root / 'olah-repos'}\"\n"
            f"mirrors-path = [\"{self.mirrors}\"]\nmetadata-cache-ttl = 0\n"
            "[accessibility]\noffline = true\n")
        log = open(self.root / "olah.log", "wb")  # noqa: SIM115 -- the server's lifetime
        self.proc = subprocess.Popen([str(BIN / "olah-cli"), "-c", str(config)], cwd=self.root,
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_listening(self.port, self.proc)
        return self

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(SAFETY)


def wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    """Until the server accepts connections (it imports for a few seconds first)."""
    deadline = time.monotonic() + SAFETY
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"olah exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"olah did not listen on port {port}")


class Throttle:
    """A TCP proxy to `port` that sends at most `rate` bytes per second towards the client
    (None: as fast as it can), counting connections and bytes."""

    def __init__(self, port: int, rate: float | None = None) -> None:
        self.target = port
        self.rate = rate
        self.connections = 0
        self.bytes = 0
        self.ranges: list[str] = []  # the Range headers of the requests that went through
        self._lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def is_down(self) -> bool:
        return self.sock.fileno() == -1

    def down(self) -> None:
        """No network: connections are refused (ECONNREFUSED) until `up`."""
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread; close alone would not
        self.sock.close()

    def up(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR: same port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            sock = self.sock
            try:
                client, _ = sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, False),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True),
                             daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, down: bool) -> None:
        try:
            while data := src.recv(8192 if down and self.rate else 65536):
                if not down:
                    self.ranges += [r.decode() for r in re.findall(rb"(?im)^range: *(\S+)", data)]
                if down:
                    with self._lock:
                        self.bytes += len(data)
                    rate = self.rate
                    if rate:
                        time.sleep(len(data) / rate)  # the throttle itself, not a wait
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self.sock.close()


@contextmanager
def serving(root: Path, make_model: Callable[..., Path]
            ) -> Iterator[tuple[Hub, Throttle, dict[str, str]]]:
    """olah serving org/tiny (two commits: seed 0, then seed 1) and org/huge (10 TB listed),
    reached through a throttle (olah's links name the throttle too)."""
    h = Hub(root)
    commits = {"v1": h.publish(make_model()), "v2": h.publish(make_model(seed=1))}
    h.publish(make_model(), "org/huge", fake_sizes={"model-2.safetensors": 10**13})
    t = Throttle(h.port)
    try:
        h.start(f"127.0.0.1:{t.port}")
        yield h, t, commits
    finally:
        t.close()
        h.close()
