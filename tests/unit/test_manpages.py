"""The man pages (man/exod.8, man/exoctl.1, man/exod.yaml.5): they render without a single
groff warning, `man -l` shows them, and they stay in sync with the code: every config key with
its default and bounds, every command and option, every state and transition, every exit code.
Needs groff and man-db (scripts/system-deps.sh test installs them); nothing else."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import click
import pytest

from exod.cli import exoctl, exod
from exod.config import explain, explain_keys, load_config

from exod.core import exits
from exod.core.states import TRANSITIONS, State
from tests.unit.conftest import make_model_dir

REPO = Path(__file__).resolve().parents[2]
MAN = REPO / "man"
PAGES = ("exod.8", "exoctl.1", "exod.yaml.5")

HEADINGS = {
    "exod.8": ["NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "STATES", "RESTARTS",
               "TERMINATION LADDER", "SIGNALS", "RELOAD", "RUNNERS", "HTTP API",
               "MULTI-RANK AND MULTI-HOST", "SERVICE MANAGER INTEGRATION", "LOGGING",
               "EXIT STATUS", "ENVIRONMENT", "FILES", "SEE ALSO"],
    "exoctl.1": ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "COMMANDS", "STATES",
                 "STATUS JSON", "EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES", "SEE ALSO"],
    "exod.yaml.5": ["NAME", "SYNOPSIS", "DESCRIPTION", "FILE FORMAT", "KEYS", "MULTI-HOST",
                    "VALIDATION", "EXAMPLES", "FILES", "SEE ALSO"],
}

ESCAPES = {"\\-": "-", "\\&": "", "\\%": "", "\\e": "\\", "\\(aq": "'", "\\(dq": '"',
           "\\(ti": "~", "\\(ha": "^", "\\(->": "->", "\\(mu": "x", "\\(+-": "+-", "\\(bu": "*"}


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is missing: the man page checks need groff and man-db "
                    "(scripts/system-deps.sh test installs them)")
    return path


def source(page: str) -> str:
    return (MAN / page).read_text(encoding="utf-8")


def plain(roff: str) -> str:
    """Roff source as the reader sees the words: no font changes, escapes resolved."""
    text = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", roff)
    for escape, char in ESCAPES.items():
        text = text.replace(escape, char)
    return text


def sections(page: str) -> dict[str, list[str]]:
    """`.SH` name -> its source lines (roff, not yet `plain`)."""
    out: dict[str, list[str]] = {}
    current = ""
    for line in source(page).splitlines():
        if line.startswith(".SH "):
            current = plain(line[4:]).strip().strip('"')
            out[current] = []
        elif current:
            out[current].append(line)
    return out


def tags(lines: list[str]) -> list[str]:
    """The tag of every `.TP` paragraph, as plain text."""
    found = []
    for i, line in enumerate(lines[:-1]):
        if line.startswith(".TP"):
            tag = lines[i + 1]
            tag = re.sub(r"^\.(B|I|BR|RB|BI|IB|IR|RI)\s+", "", tag)
            found.append(plain(tag).replace('"', "").strip())
    return found


def entries(lines: list[str]) -> dict[str, str]:
    """`.TP` tag -> the plain text of its paragraph (whitespace collapsed)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(lines) - 1:
        if not lines[i].startswith(".TP"):
            i += 1
            continue
        tag = plain(re.sub(r"^\.\w+\s+", "", lines[i + 1])).replace('"', "").strip()
        body = []
        i += 2
        while i < len(lines) and not lines[i].startswith((".TP", ".SS", ".SH")):
            body.append(re.sub(r"^\.\w+\s*", "", lines[i]))
            i += 1
        out[tag] = " ".join(plain(" ".join(body)).replace('"', "").split())
    return out


# ---- rendering ---------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("device", [[], ["-Tutf8"]], ids=["ps", "utf8"])
def test_groff_has_no_warnings(page: str, device: list[str]) -> None:
    proc = subprocess.run([need("groff"), "-man", "-ww", "-z", *device, str(MAN / page)],
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


@pytest.mark.parametrize("page", PAGES)
def test_man_renders_every_section(page: str) -> None:
    env = {**os.environ, "MANPAGER": "cat", "PAGER": "cat", "MANWIDTH": "80",
           "MAN_DISABLE_SECCOMP": "1"}
    env.pop("MAN_KEEP_FORMATTING", None)
    proc = subprocess.run([need("man"), "-l", str(MAN / page)], check=False,
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.replace("\u2212", "-").replace("\u2010", "-")
    headings = {line.strip() for line in text.splitlines() if line[:1].isupper()}
    missing = [h for h in HEADINGS[page] if h not in headings]
    assert not missing, f"{page} renders without {missing}"
    assert len(proc.stdout.splitlines()) > 50


@pytest.mark.parametrize("page", PAGES)
def test_source_is_ascii_and_in_sections(page: str) -> None:
    """Non-ASCII input needs preconv, which plain groff does not run: use roff escapes."""
    text = source(page)
    assert text.isascii(), [line for line in text.splitlines() if not line.isascii()][:3]
    found = iter(sections(page))
    assert all(h in found for h in HEADINGS[page]), (  # in this order; others may come between
        f"{page}: sections {list(sections(page))}, expected in order {HEADINGS[page]}")


# ---- exod.yaml(5) against the schema --------------------------------------------------------


def explained() -> dict[str, tuple[str, str]]:
    """key path -> (type, default) as `exod check --explain` prints them."""
    lines = explain_keys().splitlines()
    out = {}
    for i, line in enumerate(lines):
        if line and not line[0].isspace() and " " not in line:
            kind, _, default = lines[i + 1].strip().rpartition("; ")
            out[line] = (kind, default)
    return out


def test_yaml_page_keys_are_generated_from_the_schema() -> None:
    """The KEYS section is the schema's, as `exod check --explain` prints it: a key, a type, a
    default or a word of documentation changed in one and not the other fails here."""
    page = source("exod.yaml.5")
    assert explain.generated(page) == explain.keys_roff(), (
        "man/exod.yaml.5's KEYS section differs from exod/config/schema.py: run `make man`")
    docs = entries(sections("exod.yaml.5")["KEYS"])
    # Each key's documentation is the schema's (a sentence of it, as the reader sees it).
    for k in explain.key_docs():
        first = plain(explain._roff(k.doc.split(". ")[0])).replace('"', "")
        assert " ".join(first.split()) in docs[k.key], k.key


def test_yaml_page_documents_exactly_the_schema_keys() -> None:
    keys = explained()
    assert "instances.<name>.hosts[].address" in keys and len(keys) > 40
    documented = tags(sections("exod.yaml.5")["KEYS"])
    assert sorted(set(documented)) == sorted(documented), "a key is documented twice"
    assert set(documented) == set(keys), (
        f"missing: {sorted(set(keys) - set(documented))}; "
        f"stale: {sorted(set(documented) - set(keys))}")


def test_yaml_page_gives_every_default_and_bound() -> None:
    docs = entries(sections("exod.yaml.5")["KEYS"])
    wrong = []
    for key, (kind, default) in explained().items():
        text = docs[key].lower()
        value = re.sub(r"^default: ", "", default)
        value = re.sub(r" \(.*\)$", "", value)  # "(keys written here override only themselves)"
        if value == "required":
            expected = ["required"]
        elif value in ("see the keys below", "computed at start-up"):
            expected = []
        else:
            expected = [f"default: {value}" if value.startswith("from ") else value]
        bounds = re.findall(r"(\S*\d\S* to \S*\d\S*|at least \S+|at most \S+)(?:,|$)", kind)
        # "As defaults.stop.grace; ..." states the bounds there, once.
        same_as = re.match(r"as (defaults\.[\w.]+) ?;", text)
        bounded = docs[same_as[1]].lower() if same_as else text
        wrong += [f"{key}: {e!r}" for e in expected if e.lower() not in text]
        wrong += [f"{key}: {b!r}" for b in bounds if b.lower() not in bounded]
    assert not wrong, "exod.yaml.5 disagrees with `exod check --explain`: " + "; ".join(wrong)


def test_yaml_page_examples_are_valid_configs(tmp_path: Path) -> None:
    """The annotated example, its drop-in and the multi-host example load without a problem."""
    blocks = re.findall(r"^\.EX\n(.*?)^\.EE$", "\n".join(sections("exod.yaml.5")["EXAMPLES"]),
                        re.M | re.S)
    main, dropin, alpha = (plain(b).replace("/srv/models/", f"{tmp_path}/srv/models/")
                           for b in blocks[:3])
    for text in (main, dropin, alpha):
        for model in re.findall(r"model: (\S+)", text):
            base = tmp_path / "etc" / "exod"
            make_model_dir(base / model, {"model_type": "llama", "num_hidden_layers": 32,
                                          "num_attention_heads": 32, "num_key_value_heads": 8})
    etc = tmp_path / "etc" / "exod"
    (etc / "instances.d").mkdir(parents=True)
    (etc / "exod.yaml").write_text(main)
    (etc / "instances.d" / "coder.yaml").write_text(dropin)
    key = tmp_path / "cluster.key"
    key.write_text("0123456789abcdef" * 4)
    key.chmod(0o600)
    (tmp_path / "alpha.yaml").write_text(alpha.replace("/etc/exod/cluster.key", str(key)))
    cfg = load_config(etc / "exod.yaml")
    assert sorted(cfg.instances) == ["big", "coder", "small"]
    assert cfg.instances["big"].stop.grace == 30 and cfg.instances["big"].stop.attempts == 3
    pair = load_config(tmp_path / "alpha.yaml").instances["pair"]
    assert pair.port_base == 6310 and [h.name for h in pair.hosts] == ["alpha", "beta"]


# ---- exod(8) and exoctl(1) against the CLIs and the core --------------------------------------


def option_names(cmd: click.Command) -> set[str]:
    names = set()
    for param in cmd.params:
        if isinstance(param, click.Option):
            names.update(param.opts + param.secondary_opts)
    return names


def subsections(lines: list[str]) -> dict[str, list[str]]:
    """`.SS` heading (plain) -> its source lines."""
    out: dict[str, list[str]] = {}
    current = None
    for line in lines:
        if line.startswith(".SS "):
            current = plain(line[4:]).strip().strip('"')
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return out


def tag_words(lines: list[str]) -> set[str]:
    return {w for t in tags(lines) for w in re.findall(r"[\w-]+", t)}


@pytest.mark.parametrize(("page", "group", "prefix", "globals_at"),
                         [("exod.8", exod.main, "exod ", ("COMMANDS", "Global options")),
                          ("exoctl.1", exoctl.main, "", ("OPTIONS", None))])
def test_every_command_and_option_is_documented(page: str, group: click.Group, prefix: str,
                                                globals_at: tuple[str, str | None]) -> None:
    """Each command has its own subsection, and each option a tagged paragraph in it."""
    parts = sections(page)
    commands = subsections(parts["COMMANDS"])
    missing = []
    for name, cmd in group.commands.items():
        heading = next((h for h in commands if re.match(rf"{prefix}{name}(\s|$)", h)), None)
        if heading is None:
            missing.append(f"command {name}")
            continue
        words = tag_words(commands[heading])
        missing += [f"{name} {o}" for o in sorted(option_names(cmd)) if o not in words]
    section, sub = globals_at
    lines = subsections(parts[section])[sub] if sub else parts[section]
    helps = group.context_settings.get("help_option_names", ["--help"])
    missing += [o for o in sorted(option_names(group) | set(helps)) if o not in tag_words(lines)]
    assert not missing, f"{page} does not document: {missing}"


def test_exod_page_lists_every_state_and_transition() -> None:
    lines = sections("exod.8")["STATES"]
    assert set(tags(lines)) >= {s.value for s in State}
    documented = {}
    for i, line in enumerate(lines[:-1]):
        arrow = re.match(r"^\\\(-> (.*)$", lines[i + 1])
        if line.startswith(".B ") and arrow:
            documented[State(line[3:])] = frozenset(State(s) for s in arrow[1].split(", "))
    assert documented == TRANSITIONS


def exit_codes(module: object) -> dict[str, int]:
    return {k: v for k, v in vars(module).items() if k.startswith("EXIT_") and isinstance(v, int)}


def test_exod_page_explains_every_exit_code() -> None:
    numbers = set(tags(sections("exod.8")["EXIT STATUS"]))
    body = plain("\n".join(sections("exod.8")["EXIT STATUS"]))
    codes = exit_codes(exits)
    assert {"EXIT_OK", "EXIT_PEER_LOST", "EXIT_CONFIG", "EXIT_NOT_RUNNING"} <= set(codes)
    missing = [f"{name} = {code}" for name, code in codes.items()
               if str(code) not in numbers and not re.search(rf"\b{code}\b", body)]
    assert not missing, f"exod.8 EXIT STATUS does not mention {missing}"
    runner = {n for n, c in codes.items() if c != exits.EXIT_NOT_RUNNING}
    assert all(str(codes[n]) in numbers for n in runner)


def test_exoctl_page_explains_every_exit_code() -> None:
    numbers = set(tags(sections("exoctl.1")["EXIT STATUS"]))
    assert {"0", "1", "2", str(exits.EXIT_NOT_RUNNING), str(exoctl.EXIT_TIMEOUT)} <= numbers
