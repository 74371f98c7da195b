"""Nothing exod starts imports from the folder it was started in (issue 45, item 3): a daemon
whose working directory holds planted `exod/`, `mlx/`, `mlx_lm/` and `tests/` packages and a
`runpy.py` (each writes a marker and exits 97 when imported, as `python -m` would make every
child do) runs its zygote, its forked and exec'd runners, the split probe and a hub fetcher on
the installed code, in its runtime folder; so do `exod check`'s probe and `exod demo`'s
converter (exod.child_start)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from exod.child_start import BOOT
from exod.models import demo
from tests.harness import EXOD, REPO, Daemon
from tests.hub import Hub, Throttle, serving

PLANTED_PACKAGES = ("exod", "mlx", "mlx_lm", "tests")
PLANTED = 97  # the exit code of a process that imported a planted package


def plant(folder: Path) -> Path:
    """Planted packages in `folder`; the marker file their import writes."""
    marker = folder / "planted-imported"
    code = ("import os, sys\n"
            f"with open({str(marker)!r}, 'a') as f:\n"
            "    f.write(f'{__name__} imported by pid {os.getpid()}: {sys.argv}\\n')\n"
            f"os._exit({PLANTED})\n")
    for name in PLANTED_PACKAGES:
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(code)
    (folder / "runpy.py").write_text(code)  # what `python -m` itself imports on 3.10
    return marker


def imported(marker: Path) -> str:
    return marker.read_text() if marker.exists() else ""


def until_ready_or_planted(d: Daemon, names: tuple[str, ...], marker: Path) -> None:
    """Every instance ready, or fail at once when a planted package was imported."""
    def done(snap: dict[str, Any]) -> bool:
        states = {i["name"]: i["state"] for i in snap["instances"]}
        return marker.exists() or all(states.get(name) == "ready" for name in names)

    d.watch_until(done, what=f"{', '.join(names)} ready")
    assert not marker.exists(), imported(marker)


def cwd_of(pid: int) -> Path:
    return Path(os.readlink(f"/proc/{pid}/cwd"))


def pythons() -> list[str]:
    """This Python, and any other of those exod supports found on PATH that runs."""
    found = [sys.executable]
    for minor in range(10, 15):
        other = shutil.which(f"python3.{minor}")
        if other and subprocess.run([other, "-c", ""], capture_output=True,
                                    check=False).returncode == 0:
            found.append(other)
    return found


@pytest.mark.parametrize("python", pythons())
def test_the_bootstrap_runs_a_module_as_dash_m_would_but_never_from_its_folder(
        python: str, tmp_path: Path) -> None:
    """What `python_argv` starts, on each Python at hand (3.10 has no `-P`: the bootstrap's
    first line does its work)."""
    lib, here, own = tmp_path / "lib", tmp_path / "here", tmp_path / "own"
    for folder in (lib, here, own):
        folder.mkdir()
    marker = plant(here)
    (here / "mod.py").write_text(f"import os\nos._exit({PLANTED})\n")
    (lib / "mod.py").write_text(
        "import json, os, sys\n"
        "print(json.dumps({'cwd': os.getcwd(), 'path': sys.path, 'argv': sys.argv,"
        " 'name': __name__}))\n")
    new = subprocess.run([python, "-c", "import sys; print(sys.version_info >= (3, 11))"],
                         capture_output=True, text=True, check=True).stdout.strip() == "True"
    argv = [python, *(["-P"] if new else []), "-c", BOOT, str(own), "mod", "a", "-b"]
    got = subprocess.run(argv, cwd=here, env={**os.environ, "PYTHONPATH": str(lib)},
                         capture_output=True, text=True, timeout=60, check=False)
    assert not marker.exists(), imported(marker)
    assert got.returncode == 0, got.stderr
    seen = json.loads(got.stdout)
    assert seen["cwd"] == str(own) and seen["name"] == "__main__"
    assert seen["argv"] == [str(lib / "mod.py"), "a", "-b"]
    assert seen["path"][0] == str(lib) and "" not in seen["path"]
    assert str(here) not in seen["path"] and str(own) not in seen["path"]


def test_runners_the_zygote_and_the_probe_ignore_packages_in_the_working_directory(
        daemons: Callable[..., Daemon], tiny_model: Path) -> None:
    d = daemons({"instances": {
        "pair": {"model": str(tiny_model), "shards": 2},  # probed first; forked ranks
        "own": {"model": str(tiny_model), "env": {"EXOD_TEST_OWN": "1"}},  # exec'd
    }})
    cache = d.dir / "xdg-cache"  # no cached verdict: the daemon's config load probes
    d.env["XDG_CACHE_HOME"] = str(cache)
    marker = plant(d.dir)  # the daemon's working directory (tests.harness)
    d.start()
    until_ready_or_planted(d, ("pair", "own"), marker)
    assert list((cache / "exod" / "probe").glob("*.json")), "the probe gave no answer"
    run_dir = d.socket.parent
    pids = [r["pid"] for name in ("pair", "own") for r in d.instance(name)["ranks"]]
    for pid in pids:
        assert cwd_of(pid) == run_dir, pid
    own = Path(f"/proc/{pids[-1]}/cmdline").read_bytes().split(b"\0")
    assert b"exod.runner" in own and b"-m" not in own
    assert (b"-P" in own) == (sys.version_info >= (3, 11)), own
    c = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0, timeout=120)
    for name in ("pair", "own"):
        reply = c.chat.completions.create(model=name, max_tokens=3,
                                          messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content is not None
    assert d.terminate() == 0
    assert not marker.exists(), imported(marker)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_model_factory: Callable[..., Path]
           ) -> Iterator[tuple[Hub, Throttle, dict[str, str]]]:
    with serving(tmp_path_factory.mktemp("hub"), tiny_model_factory) as it:
        yield it


def test_a_hub_fetcher_ignores_packages_in_the_working_directory(
        daemons: Callable[..., Daemon], served: tuple[Hub, Throttle, dict[str, str]],
        tmp_path: Path) -> None:
    hub, _, commits = served
    d = daemons({"hub": {"cache": str(tmp_path / "hub")}, "instances": {
        "a": {"model": "hf:org/tiny", "env": {"EXOD_DOUBLE": "cooperative"}}}},
        env={"HF_ENDPOINT": hub.url})
    marker = plant(d.dir)
    d.start()
    until_ready_or_planted(d, ("a",), marker)
    assert d.instance("a")["model"].endswith(commits["v2"])  # fetched, not found
    assert d.terminate() == 0


def test_exod_check_and_exod_demo_ignore_packages_in_the_working_directory(
        tiny_model: Path, tmp_path: Path) -> None:
    here = tmp_path / "here"
    here.mkdir()
    marker = plant(here)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg-cache"),
           "PYTHONPATH": str(REPO)}  # not make's relative `.`: that would name `here`
    config = here / "exod.yaml"
    config.write_text(yaml.safe_dump({"control": {"socket": str(tmp_path / "c.sock")},
                                      "instances": {"pair": {"model": str(tiny_model),
                                                             "shards": 2}}}))
    check = subprocess.run([*EXOD, "check", "-c", str(config)], cwd=here, env=env,
                           capture_output=True, text=True, timeout=300, check=False)
    assert not marker.exists(), imported(marker)
    assert check.returncode == 0, check.stdout + check.stderr
    assert list((tmp_path / "xdg-cache" / "exod" / "probe").glob("*.json")), "no probe ran"

    # The converter's quick path: a demo model already prepared, in a cache named relatively.
    prepared = here / "cache" / demo.MODEL_DIR_NAME
    prepared.mkdir(parents=True)
    (prepared / "config.json").write_text("{}")
    (prepared / ".exod-model.json").write_text(json.dumps({
        "params": {"converter": "exod.models.demo", "version": demo.CONVERTER_VERSION,
                   "gguf_sha256": demo.GGUF_SHA256}, "files": {"config.json": 2}}))
    made = subprocess.run([*EXOD, "demo", "--cache-dir", "cache"], cwd=here, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert not marker.exists(), imported(marker)
    assert made.returncode == 0, made.stdout + made.stderr
    assert made.stdout.strip() == str(here / "cache" / "demo.yaml")
    assert f"model: {prepared}" in (here / "cache" / "demo.yaml").read_text()
