"""`python -m exod.hub --channel-fd N`: what the daemon runs to fetch a model (exod.hub.fetch), and
`exod check` to learn what fetching one would take.

Its command line holds the channel's descriptor alone. It says hello on the channel; the first
frame it reads is what to do (exod.wire.specs): a `FetchSpec` (fetch, reporting `DownloadProgress`,
then `Fetched` or `Failed`), or a `PlanAsk` (one `Planned` or `Failed`, nothing downloaded).
Then a shutdown request (rung 1 of the ladder) or the end of the channel ends the process at
once: whatever was downloaded stays on disk, and the next fetch resumes from it.

The token is read from its file here: it is never in a frame, an argv, an environment or a log.
Exit codes: 0 fetched, 69 refused (retrying will not help, or the hub cannot be reached and no
download is under way), 75 a network error (retried), 64 no spec."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from exod.wire import messages as m
from exod.wire.child_end import ChildEnd
from exod.core.exits import EXIT_UNAVAILABLE, EXIT_USAGE
from exod.hub import from_peers
from exod.hub.fetch import FetchJob, main, plan_only
from exod.core.hub_ref import make
from exod.secret_file import KEY_BYTES, SecretFileError, read_secret
from exod.wire.specs import FETCHER_FIRST, FetchSpec, PlanAsk

SPEC_WAIT = 60.0  # the parent sends it as soon as it reads the hello


def channel_fd(argv: list[str] | None) -> int | None:
    p = argparse.ArgumentParser(prog="python -m exod.hub", description=__doc__)
    p.add_argument("--channel-fd", type=int, default=None)
    args, _ = p.parse_known_args(argv)  # an older daemon's flags: it hears the hello all the same
    fd: int | None = args.channel_fd
    return fd


def read_token(path: Path | None) -> str | bool:
    """The token in hub.hf_token_file (a secret file: exod.secret_file's rule), False for
    none. Raises OSError (one line) when unusable."""
    if path is None:
        return False
    try:
        return read_secret(path, least=0).decode("utf-8") or False
    except UnicodeDecodeError:
        raise SecretFileError(f"{path} is not UTF-8 text") from None


def on_message(link: ChildEnd[FetchSpec], msg: m.ToFetcher) -> None:
    link.send(m.Stopping(reason="stop requested"))
    os._exit(0)  # partial files stay: the next fetch resumes from them


def entry(argv: list[str] | None = None) -> int:
    link: ChildEnd[FetchSpec] = ChildEnd(channel_fd(argv), FETCHER_FIRST, m.TO_FETCHER)
    # The daemon gone (or the channel broken): nobody wants this download.
    link.start(lambda msg: on_message(link, msg), lambda why: os._exit(0))
    spec = link.spec(SPEC_WAIT)
    if spec is None:
        print("no fetch spec on the channel (--channel-fd): exod starts fetchers", flush=True)
        return EXIT_USAGE
    # Before huggingface_hub is imported: it reads these once.
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ.pop("HF_TOKEN", None)  # the token comes from hub.hf_token_file, or none is sent
    if spec.offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        token = read_token(spec.token_file)
    except OSError as e:
        print(f"hub.hf_token_file: {e.strerror}", flush=True)
        return EXIT_UNAVAILABLE
    try:
        ref = make(spec.ref.repo, spec.ref.revision)
    except ValueError as e:
        print(f"bad fetch spec: {e}", flush=True)
        return EXIT_USAGE
    peers, key = spec.peers, b""
    if peers and spec.cluster_key_file is not None:
        try:
            key = read_secret(spec.cluster_key_file, KEY_BYTES)
        except OSError as e:  # the peers cannot be asked: the hub can
            print(f"cluster.key_file: {e.strerror or e}; the hub alone is asked", flush=True)
            peers = ()
    job = FetchJob(ref, spec.cache, spec.offline, token, spec.commit, link, peers, key)
    return plan_only(job) if isinstance(spec, PlanAsk) else main(job, from_peers.run)


if __name__ == "__main__":
    sys.exit(entry())
