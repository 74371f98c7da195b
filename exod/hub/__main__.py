"""`python -m exod.hub --repo ORG/NAME --revision R --cache DIR [--commit C] [--offline]
[--token-file F] --channel-fd N`: what the daemon runs to fetch a model (exod.hub.fetch).

The token is read from its file here: it is never in an argv, an environment or a log.
Exit codes: 0 fetched, 69 refused (retrying will not help, or the hub cannot be reached and no
download is under way), 75 a network error (retried)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from exod.core.exits import EXIT_UNAVAILABLE
from exod.hub.fetch import Job, main, plan_only
from exod.hub.link import Link
from exod.hub.ref import make
from exod.secret_file import SecretFileError, read_secret


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m exod.hub", description=__doc__)
    p.add_argument("--repo", required=True)
    p.add_argument("--revision", default="main")
    p.add_argument("--cache", required=True, type=Path)
    p.add_argument("--commit", default=None)
    p.add_argument("--offline", action="store_true")
    p.add_argument("--token-file", type=Path, default=None)
    p.add_argument("--channel-fd", type=int, default=None)
    p.add_argument("--plan", action="store_true",
                   help="print the files' total size and what is still missing (JSON), as "
                        "`exod check` shows them; download nothing")
    return p.parse_args(argv)


def read_token(path: Path | None) -> str | bool:
    """The token in hub.hf_token_file (a secret file: exod.secret_file's rule), False for
    none. Raises OSError (one line) when unusable."""
    if path is None:
        return False
    try:
        return read_secret(path, least=0).decode("utf-8") or False
    except UnicodeDecodeError:
        raise SecretFileError(f"{path} is not UTF-8 text") from None


def entry(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Before huggingface_hub is imported: it reads these once.
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ.pop("HF_TOKEN", None)  # the token comes from hub.hf_token_file, or none is sent
    if args.offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    link = Link(args.channel_fd)
    try:
        token = read_token(args.token_file)
    except OSError as e:
        link.start()
        print(f"hub.hf_token_file: {e.strerror}", flush=True)
        return EXIT_UNAVAILABLE
    job = Job(make(args.repo, args.revision), args.cache, args.offline, token, args.commit, link)
    return plan_only(job) if args.plan else main(job)


if __name__ == "__main__":
    sys.exit(entry())
