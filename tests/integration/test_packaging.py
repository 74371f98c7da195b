"""The wheel and sdist built from pyproject (`python -m build`): they hold the man pages, the
systemd units and the launchd plists, and no test code; installed into a fresh venv, the
wheel's exod reports its version from the package metadata and installs its service files
from PREFIX/share/exod (`exod install --root`, `--dry-run`)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from exod import __version__
from exod.service_files.install import home_binds

REPO = Path(__file__).resolve().parents[2]
SHARE = ["share/man/man1/exoctl.1", "share/man/man5/exod.yaml.5", "share/man/man8/exod.8",
         "share/exod/exod.yaml", "share/exod/systemd/exod.service",
         "share/exod/systemd/exod-user.service", "share/exod/systemd/exod.sysusers",
         "share/exod/launchd/io.exod.exod.plist", "share/exod/launchd/io.exod.exod.agent.plist"]


def run(*argv: str, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def no_test_code(names: list[str]) -> None:
    tests = [n for n in names if "/tests/" in f"/{n}" or Path(n).name.startswith("test_")
             or "conftest" in n]
    assert not tests, tests


def test_wheel_and_sdist_install_into_a_fresh_venv(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--outdir", str(dist), str(REPO))
    wheel = next(dist.glob("exod-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    data = f"exod-{__version__}.data/data/"
    assert all(data + s in names for s in SHARE), sorted(n for n in names if data in n)
    no_test_code(names)
    with tarfile.open(next(dist.glob("exod-*.tar.gz"))) as sdist:
        members = [m.split("/", 1)[1] for m in sdist.getnames() if "/" in m]
    assert {"man/exod.8", "packaging/systemd/exod.service", "packaging/systemd/exod-user.service",
            "packaging/launchd/io.exod.exod.plist", "config/exod.yaml"} <= set(members)
    no_test_code(members)

    venv = tmp_path / "venv"
    # Without the caller's PYTHONPATH (`make test-profile` sets it to the checkout): there pip
    # found the checkout's exod.egg-info, took exod as installed, and installed no `exod`.
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run(sys.executable, "-m", "venv", "--without-pip", str(venv), env=clean)
    run(sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q",
        "--no-deps", "--no-index", str(wheel), env=clean)
    # The CLI's dependencies from this venv (installing them afresh takes minutes), after the
    # fresh venv's own site-packages, so that exod itself comes from the wheel.
    site = next(venv.glob("lib/python*/site-packages"))
    ours = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    (site / "deps.pth").write_text(ours + "\n")
    exod = str(venv / "bin/exod")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    assert run(exod, "--version", env=env).strip() == f"exod, version {__version__}"

    root = tmp_path / "root"
    out = run(exod, "install", "--root", str(root), env=env)
    assert f"created   {root}/etc/systemd/system/exod.service" in out, out
    unit = (root / "etc/systemd/system/exod.service").read_text()
    shipped = (venv / "share/exod/systemd/exod.service").read_text()
    assert f"ExecStart={exod} run -c /etc/exod/exod.yaml" in unit
    assert unit.split("\n", 1)[1] == shipped.replace("ExecStart=/usr/bin/exod",
                                                     f"ExecStart={exod}")
    dropin = root / "etc/systemd/system/exod.service.d/exod-install-home.conf"
    binds = home_binds([os.path.realpath(sys.base_prefix), str(venv)])
    assert dropin.exists() == bool(binds)
    assert "then:     systemctl enable exod.service" in out
    again = run(exod, "install", "--root", str(root), env=env)
    assert "nothing changed" in again, again

    dry = run(exod, "install", "--dry-run", "--root", str(tmp_path / "dry"), env=env)
    assert f"--- {tmp_path}/dry/etc/systemd/system/exod.service mode 0644" in dry
    assert not (tmp_path / "dry").exists()


def test_make_install_from_a_python_under_a_home(tmp_path: Path) -> None:
    """`make install`'s steps, and what they give when the Python lies under a home (this
    machine's often does: pyenv under /root): a venv at INSTALL_PREFIX made by that Python,
    whose `exod install` binds the Python's prefix read-only and nothing else (the venv itself
    is outside every home). The venv is made as the Makefile makes it, but exod and its
    dependencies come from this checkout through a .pth, and its `exod` script is written as
    pip writes it: `pip install .` of mlx and the rest would take minutes and prove nothing
    about the target."""
    prefix = tmp_path / "opt-exod"
    python = os.path.join(os.path.realpath(sys.base_prefix), "bin", "python3")
    steps = run("make", "-n", "-s", "-C", str(REPO), "install", f"PYTHON={python}",
                f"INSTALL_PREFIX={prefix}").splitlines()
    assert steps == ["scripts/system-deps.sh run", f"{python} -m venv {prefix}",
                     f"{prefix}/bin/python -m pip install -q .", f"{prefix}/bin/exod install"]

    run(python, "-m", "venv", "--without-pip", str(prefix))
    site = next(prefix.glob("lib/python*/site-packages"))
    ours = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    (site / "exod-test.pth").write_text(f"{REPO}\n{ours}\n")
    exod = prefix / "bin/exod"
    exod.write_text(f"#!{prefix}/bin/python\nimport sys\nfrom exod.cli.exod import main\n"
                    "sys.exit(main())\n")
    exod.chmod(0o755)
    root = tmp_path / "root"
    out = run(str(exod), "install", "--root", str(root),
              env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    unit = (root / "etc/systemd/system/exod.service").read_text()
    assert f"ExecStart={exod} run -c /etc/exod/exod.yaml" in unit, unit
    dropin = root / "etc/systemd/system/exod.service.d/exod-install-home.conf"
    base = os.path.realpath(sys.base_prefix)
    if home_binds([base]):
        assert f"BindReadOnlyPaths={base}\n" in dropin.read_text(), out
    else:
        assert not dropin.exists(), out
