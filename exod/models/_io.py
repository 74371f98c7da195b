"""File plumbing shared by the model preparation tools (no mlx here).

A prepared model directory is published with one `rename`, and carries a stamp file written
last, so a directory at the target path is always complete: an interrupted build leaves only a
hidden staging directory, which the next build removes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from exod.paths import READABLE, make_dirs

STAMP_NAME = ".exod-model.json"


def log(message: str) -> None:
    """Progress goes to stderr: stdout of the CLIs is reserved for the resulting path."""
    print(message, file=sys.stderr, flush=True)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def read_stamp(model_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((model_dir / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_complete(model_dir: Path, params: Mapping[str, Any]) -> bool:
    """True when the stamp names these parameters and every file it lists has its recorded size."""
    stamp = read_stamp(model_dir)
    if stamp is None or stamp.get("params") != dict(params):
        return False
    files = stamp.get("files")
    if not isinstance(files, dict) or not files:
        return False
    try:
        return all((model_dir / name).stat().st_size == size for name, size in files.items())
    except OSError:
        return False


def _write_stamp(model_dir: Path, params: Mapping[str, Any]) -> None:
    files = {p.name: p.stat().st_size for p in sorted(model_dir.iterdir()) if p.is_file()}
    write_json(model_dir / STAMP_NAME, {"params": dict(params), "files": files})


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Serialise builders of one target (two test sessions, or the daemon and a user)."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def build_atomically(
    out_dir: Path,
    params: Mapping[str, Any],
    build: Callable[[Path], None],
    *,
    force: bool = False,
) -> Path:
    """Return `out_dir`, building it with `build(staging_dir)` unless it is already complete.

    Refuses to replace a non-empty directory that has no stamp: it is not ours to delete.
    """
    out_dir = out_dir.absolute()
    if not force and is_complete(out_dir, params):
        return out_dir  # fast path without the lock: the stamp is only ever written complete
    make_dirs(out_dir.parent, READABLE)  # the demo's: exod's cache, made 0700 before
    with _locked(out_dir.parent / f".{out_dir.name}.lock"):
        if not force and is_complete(out_dir, params):
            return out_dir  # another process built it while we waited
        if out_dir.exists() and read_stamp(out_dir) is None and any(out_dir.iterdir()):
            raise FileExistsError(f"{out_dir} exists and was not made by exod; not replacing it")
        # Under the lock, any staging directory left behind belongs to a dead builder.
        for stale in out_dir.parent.glob(f".{out_dir.name}.staging-*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = out_dir.parent / f".{out_dir.name}.staging-{os.getpid()}"
        make_dirs(staging, READABLE)  # the model's folder once published: readable, as a hub's
        try:
            build(staging)
            _write_stamp(staging, params)
            _publish(staging, out_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return out_dir


def _publish(staging: Path, out_dir: Path) -> None:
    if not out_dir.exists():
        os.rename(staging, out_dir)
        return
    # rename() cannot replace a non-empty directory: move the old one aside first.
    trash = out_dir.parent / f".{out_dir.name}.staging-old-{os.getpid()}"
    os.rename(out_dir, trash)
    os.rename(staging, out_dir)
    shutil.rmtree(trash, ignore_errors=True)


def tokenizer_config(
    *,
    bos: str,
    eos: str,
    pad: str,
    unk: str | None,
    chat_template: str,
    max_length: int,
) -> dict[str, Any]:
    """tokenizer_config.json for a tokenizer.json loaded by transformers' fast tokenizer class."""
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "chat_template": chat_template,
    }
    if unk is not None:
        config["unk_token"] = unk
    return config
