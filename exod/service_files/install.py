"""`exod install`: put the service files where systemd or launchd reads them.

The shipped unit names /usr/bin/exod and the plists /usr/local/bin/exod; the installed copies
name the exod that runs this command. An existing config is never overwritten. `--dry-run` prints
every file and its content instead of writing.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

PLIST_BIN = "/usr/local/bin/exod"  # what the shipped plists name; the unit names /usr/bin/exod
# ProtectHome= hides these from the service: a venv there cannot be the service's exod.
HIDDEN_FROM_SERVICE = ("/home/", "/root/", "/run/user/")


class InstallError(Exception):
    pass


@dataclass(frozen=True)
class Planned:
    path: Path
    content: str
    mode: int = 0o644
    keep_existing: bool = False  # configs: an operator's edits win


def packaging_dir() -> Path:
    """packaging/ of a source checkout, else what the wheel put under PREFIX/share/exod."""
    for candidate in (Path(__file__).resolve().parents[2] / "packaging",
                      Path(sys.prefix) / "share" / "exod"):
        if (candidate / "systemd" / "exod.service").is_file():
            return candidate
    raise InstallError("cannot find exod's packaging files (packaging/ or PREFIX/share/exod)")


def example_config() -> str:
    for candidate in (Path(__file__).resolve().parents[2] / "config" / "exod.yaml",
                      Path(sys.prefix) / "share" / "exod" / "exod.yaml"):
        if candidate.is_file():
            return candidate.read_text()
    raise InstallError("cannot find the example config (config/exod.yaml)")


def interpreter() -> Path:
    """The real interpreter behind this venv (a venv's python is a symlink to it)."""
    return Path(os.path.realpath(sys.executable))


def exod_binary() -> Path:
    """The `exod` script of this installation (next to the running interpreter)."""
    candidate = Path(sys.executable).parent / "exod"
    return candidate if candidate.exists() else Path(sys.argv[0]).resolve()


def hidden_part(exod: Path, interpreter: Path | None) -> Path | None:
    """The first of exod or the interpreter behind it that ProtectHome= would hide."""
    for p in (exod, interpreter):
        if p is not None and str(p).startswith(HIDDEN_FROM_SERVICE):
            return p
    return None


def systemd_plan(exod: Path, root: Path, interpreter: Path | None = None) -> list[Planned]:
    hidden = hidden_part(exod, interpreter)
    if hidden is not None:
        raise InstallError(
            f"{hidden} is under a home directory, which the unit's ProtectHome=yes hides from "
            f"the service. Install exod (and a Python) system-wide first, e.g. `make install` "
            f"(a venv in /opt/exod), then run that exod's `install`.")
    pkg = packaging_dir() / "systemd"
    unit = re.sub(r"(?m)^(ExecStart=[-@:+!]*)\S*/exod\b", rf"\g<1>{exod}",
                  (pkg / "exod.service").read_text())
    plan = [
        Planned(root / "etc/systemd/system/exod.service", unit),
        Planned(root / "etc/sysusers.d/exod.conf", (pkg / "exod.sysusers").read_text()),
        Planned(root / "etc/exod/exod.yaml", example_config(), 0o640, keep_existing=True),
    ]
    tmpfiles = pkg / "exod.tmpfiles"
    if tmpfiles.is_file():
        plan.append(Planned(root / "etc/tmpfiles.d/exod.conf", tmpfiles.read_text()))
    return plan


def launchd_plan(exod: Path, root: Path, user: bool) -> list[Planned]:
    pkg = packaging_dir() / "launchd"
    if user:
        home = Path.home()
        text = (pkg / "io.exod.exod.agent.plist").read_text()
        text = text.replace(PLIST_BIN, str(exod)).replace("~/", f"{home}/")
        return [
            Planned(root / str(home / "Library/LaunchAgents/io.exod.exod.plist").lstrip("/"),
                    text),
            Planned(root / str(home / ".config/exod/exod.yaml").lstrip("/"), example_config(),
                    0o640, keep_existing=True),
        ]
    text = (pkg / "io.exod.exod.plist").read_text().replace(PLIST_BIN, str(exod))
    return [
        Planned(root / "Library/LaunchDaemons/io.exod.exod.plist", text),
        Planned(root / "etc/exod/exod.yaml", example_config(), 0o640, keep_existing=True),
    ]


def next_command(target: str, user: bool, plan: list[Planned]) -> str:
    if target == "systemd":
        return "systemd-sysusers && systemctl daemon-reload && systemctl enable --now exod"
    plist = plan[0].path
    if user:
        return f"launchctl bootstrap gui/{os.getuid()} {plist}"
    return f"sudo mkdir -p /Library/Logs/exod && sudo launchctl bootstrap system {plist}"


def write(plan: list[Planned]) -> list[str]:
    """Write the files; returns one line per file saying what happened."""
    out = []
    for item in plan:
        if item.keep_existing and item.path.exists():
            out.append(f"kept     {item.path} (exists)")
            continue
        item.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = item.path.with_name(f".{item.path.name}.tmp")
        tmp.write_text(item.content)
        os.chmod(tmp, item.mode)
        os.replace(tmp, item.path)
        out.append(f"wrote    {item.path}")
    return out
