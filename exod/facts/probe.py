"""Whether a layout (shards, parallelism, layers) of a model works, asked of the code that
will run it: `python -m exod.runner.split.probe` in a subprocess, since the daemon and `exod check`
never import mlx. The question and its answer are typed messages on a channel (`exod.wire.ask`:
`ProbeAsk`; one `ProbeAnswer`, a `Verdict` per layout). Answers are cached on disk per (mlx-lm
version, model_type, config.json, layout, exod's splitting code), so a config is probed once,
not at every reload.

A probe that cannot run at all (mlx not installed, a config mlx-lm cannot build a model from)
gives no answer: the runner then reports the model's own problem when it loads it.

The daemon asks from a worker thread (a reload loads the config off its event loop), so a slow
probe never holds up /health, `exoctl status` or the instances already running. The probe run
is `exod.runner.split.probe` unless the environment names another module in EXOD_PROBE_MODULE (a
development and test hook, like EXOD_RUNNER_MODULE: chosen by whoever starts the daemon, never
by a config file).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
from importlib import metadata
from collections.abc import Callable
from pathlib import Path

from exod.wire import messages as m
from exod.wire import ask as asking
from exod.core.shards import Parallelism
from exod.paths import PRIVATE, cache_dir, make_dirs
from exod.wire.protocol import ProtocolError, decode_as, to_wire
from exod.wire.specs import Layout, ProbeAnswer, ProbeAsk, Verdict

PROBE_TIMEOUT = 120.0
# The probe's answer depends on its own module and every exod module it imports, directly or
# not: the whole `exod.runner.split` package and what it reaches (e.g. serving.can_batch).
_PROBE_ROOT = "exod.runner.split.probe"
_PACKAGE = Path(__file__).resolve().parents[1]


Ask = tuple[Path, int, Parallelism, "tuple[int, ...] | None"]  # model, shards, how, layers


def layout_problem(model: Path, shards: int, parallelism: Parallelism,
                   layers: tuple[int, ...] | None = None) -> str | None:
    """Why this layout cannot work, or None (it works, or the probe could not tell)."""
    answer = answers([(model, shards, parallelism, layers)])[0]
    if answer is None or answer.ok or answer.unknown:
        return None
    reason = answer.reason or "the probe refused this layout"
    return f"{reason} (detail: {answer.detail})" if answer.detail else reason


def answers(asks: list[Ask], on_probe: Callable[[float], None] | None = None
            ) -> list[Verdict | None]:
    """The probe's answer to each layout: from the cache, else from one subprocess for all
    the rest (importing mlx-lm once is most of a probe's cost). None: no answer.
    `on_probe(seconds)`: called before a probe runs, with its time limit."""
    out: list[Verdict | None] = []
    missing: list[tuple[int, Path, Ask]] = []
    try:
        code_digest()
    except (OSError, SyntaxError):
        return [None] * len(asks)  # an install missing the probe's code: no answer, never stale
    for i, ask in enumerate(asks):
        try:
            config = (ask[0] / "config.json").read_bytes()
        except OSError:
            out.append(None)  # reported elsewhere (model_dir_problem)
            continue
        cached = _cache_file(_key(config, *ask[1:]))
        out.append(_read(cached))
        if out[-1] is None:
            missing.append((i, cached, ask))
    if missing:
        if on_probe is not None:
            on_probe(limit(len(missing)))
        got = _run([ask for _, _, ask in missing])
        for (i, cached, _), answer in zip(missing, got, strict=True):
            out[i] = answer
            if answer is not None:
                _write(cached, answer)
    return out


def _key(config: bytes, shards: int, parallelism: str, layers: tuple[int, ...] | None) -> str:
    h = hashlib.sha256()
    versions = []
    for package in ("mlx-lm", "mlx-vlm"):  # mlx-vlm builds the models that see
        try:
            versions.append(metadata.version(package))
        except metadata.PackageNotFoundError:
            versions.append("none")
    h.update(code_digest().encode())
    h.update(json.dumps([versions, shards, parallelism, layers]).encode())
    h.update(config)
    return h.hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """A digest of the probe's code: the sources of every exod module the probe imports, found
    by reading their imports (nothing is imported, so no mlx here). A module that cannot be
    read is an error, never skipped: a stale cached verdict would outlive the code."""
    h = hashlib.sha256()
    for name in sorted(probe_modules()):
        h.update(name.encode() + b"\0" + _source(name).read_bytes())
    return h.hexdigest()


def probe_modules() -> set[str]:
    """exod modules the probe depends on: the split package and its transitive imports."""
    split = _PACKAGE / "runner" / "split"
    todo = [_PROBE_ROOT] + [f"exod.runner.split.{p.stem}" for p in split.glob("*.py")
                            if p.stem != "__init__"]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        tree = ast.parse(_source(name).read_bytes(), str(_source(name)))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package upwards
                    is_package = _source(name).name == "__init__.py"
                    package = name if is_package else name.rpartition(".")[0]
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                # `from exod.a import b` imports exod.a, and exod.a.b when that is a module.
                todo += [m for m in (base, *(f"{base}.{a.name}" for a in node.names))
                         if m.startswith("exod") and _exists(m)]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names
                         if a.name.startswith("exod") and _exists(a.name)]
    return seen


def _source(module: str) -> Path:
    path = _PACKAGE.parent / module.replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _exists(module: str) -> bool:
    return _source(module).is_file()


def _cache_file(key: str) -> Path:
    return cache_dir() / "probe" / f"{key}.json"


def _read(path: Path) -> Verdict | None:
    try:
        verdict: Verdict = decode_as(json.loads(path.read_text(encoding="utf-8")), Verdict)
    except (OSError, ValueError, ProtocolError):
        return None
    return verdict


def _write(path: Path, answer: Verdict) -> None:
    try:
        make_dirs(path.parent, PRIVATE)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(to_wire(answer)), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # an unwritable cache only costs a probe next time


def limit(layouts: int) -> float:
    """Seconds a probe of that many layouts may take before it counts as no answer."""
    return PROBE_TIMEOUT + 5 * layouts


def _run(asks: list[Ask]) -> list[Verdict | None]:
    module = os.environ.get("EXOD_PROBE_MODULE") or "exod.runner.split.probe"
    question = ProbeAsk(version=m.VERSION, layouts=[
        Layout(model=model, shards=n, parallelism=p, layers=lay) for model, n, p, lay in asks])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    try:
        got: ProbeAnswer = asking.ask(module, question, {ProbeAnswer.type: ProbeAnswer},
                                      limit(len(asks)), env)
    except asking.NoAnswer:
        return [None] * len(asks)
    if len(got.verdicts) != len(asks):
        return [None] * len(asks)
    return list(got.verdicts)
