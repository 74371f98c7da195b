"""The key check's cost (issue 48): tokens a second at 8 clients with a keys file of 100 named
keys against the same daemon with no auth at all; goal >= 0.99x.

One daemon and one runner serve both sides: a reload turns the keys file on and off between
rounds (the runner stays as it is), in ABBA order (EXOD_BENCH_ROUNDS pairs, default 3). Each
round: 8 clients at once, each sending REQUESTS chat completions of TOKENS tokens (EOS held
back), every client with a key of its own on the keyed side. A round's figure is its tokens
over its wall time; the figure is the median of the pairs' ratios. Beside it, the check alone:
one match against the 100 keys, in microseconds (a right key and a wrong one).
"""

from __future__ import annotations

import os
import statistics
import time
import timeit
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import yaml

from bench.common import model, report
from bench.results import Figure, note, run
from exod.core.keys import ApiKey, Keyring, digest_of, hash_text, new_secret
from tests.harness import Daemon

CLIENTS = 8
KEYS = 100
REQUESTS = 2
TOKENS = 48
ROUNDS = 6  # ABBA pairs: a busy machine's noise between rounds is far above the check's cost
GOAL = 0.99
EOS = "2"  # the generated models' <|im_end|>


def write_keys(path: Path) -> list[str]:
    """A keys file of KEYS keys, as an operator keeps it (mode 0600); their secrets."""
    secrets = [new_secret() for _ in range(KEYS)]
    path.write_text(yaml.safe_dump([{"name": f"user-{i:03d}", "owner": f"person {i}",
                                     "hash": hash_text(s), "limits": {"in_flight": 64}}
                                    for i, s in enumerate(secrets)]))
    path.chmod(0o600)
    return secrets


def one_round(url: str, secrets: list[str] | None) -> tuple[float, float]:
    """(tokens a second, a request's median seconds) of CLIENTS clients at once, each
    sending REQUESTS requests."""
    def client(i: int) -> tuple[int, list[float]]:
        c = openai.OpenAI(base_url=url + "/v1", max_retries=0, timeout=600,
                          api_key=secrets[i * 7 % KEYS] if secrets else "-")
        got, took = 0, []
        for r in range(REQUESTS):
            t0 = time.perf_counter()
            out = c.chat.completions.create(
                model="bench", max_tokens=TOKENS, temperature=0, logit_bias={EOS: -100},
                messages=[{"role": "user", "content": f"client {i} request {r}: go on"}])
            took.append(time.perf_counter() - t0)
            assert out.usage is not None
            got += out.usage.completion_tokens
        return got, took

    t = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        done = list(pool.map(client, range(CLIENTS)))
    wall = time.perf_counter() - t
    return sum(n for n, _ in done) / wall, statistics.median(x for _, xs in done for x in xs)


def check_us(secrets: list[str]) -> tuple[float, float]:
    """Microseconds one match takes against KEYS keys: (a right secret, a wrong one)."""
    ring = Keyring([(digest_of(hash_text(s)), ApiKey(f"k{i}")) for i, s in enumerate(secrets)])
    right, wrong = secrets[KEYS // 2].encode(), new_secret().encode()
    assert ring.match(right) is not None and ring.match(wrong) is None
    n = 2000
    return (min(timeit.repeat(lambda: ring.match(right), number=n, repeat=5)) / n * 1e6,
            min(timeit.repeat(lambda: ring.match(wrong), number=n, repeat=5)) / n * 1e6)


def key_cost() -> list[Figure]:
    """The figures: tok/s with 100 keys / with no auth at 8 clients, and the check's time."""
    pairs = int(os.environ.get("EXOD_BENCH_ROUNDS") or ROUNDS)
    path = model("prefix-4x256", layers=4, hidden=256, intermediate=768, heads=4, kv_heads=2)
    d = Daemon({"ready": "instances", "api": {"listen": "127.0.0.1:0"}, "instances": {
        "bench": {"model": str(path), "max_concurrency": CLIENTS}}}, name="bench-keys")
    keys_path = d.config_path.parent / "keys.yaml"
    secrets = write_keys(keys_path)
    plain = yaml.safe_load(d.config_path.read_text())
    keyed = {**plain, "api": {**plain["api"], "keys_file": str(keys_path)}}
    got: dict[str, list[float]] = {"keys": [], "none": []}
    latency: list[float] = []
    try:
        d.start()
        url = d.api_url()
        one_round(url, None)  # kernels built, caches warm, before anything is timed
        for side in ["keys", "none", "none", "keys"] * pairs:
            d.write_config(keyed if side == "keys" else plain)
            d.ctl("reload")
            assert d.status()["daemon"]["api"]["auth"] is (side == "keys")
            rate, seconds = one_round(url, secrets if side == "keys" else None)
            got[side].append(rate)
            latency.append(seconds)
    finally:
        d.terminate()
        d.close()
    ratios = [k / n for k, n in zip(got["keys"], got["none"], strict=True)]
    right, wrong = check_us(secrets)
    med = {side: statistics.median(v) for side, v in got.items()}
    note(f"{CLIENTS} clients x {REQUESTS} requests x {TOKENS} tokens a round, {2 * pairs} "
         f"rounds a side (ABBA), one daemon reloaded between them; {KEYS} keys in the file")
    request = statistics.median(latency)
    return [
        Figure("tok/s with 100 keys / no auth", statistics.median(ratios), rounds=ratios,
               goal=f">= {GOAL}x", at={"clients": CLIENTS},
               sides={"100 keys": med["keys"], "no auth": med["none"]}, side_unit="tok/s",
               text=f"{med['keys']:.0f} vs {med['none']:.0f} tok/s"),
        # The same cost without the machine's noise: the check's time against a request's.
        Figure("key check / a request's time", right / (request * 1e6) * 100, unit="%",
               goal=f"<= {(1 - GOAL) * 100:g}%", at={"clients": CLIENTS},
               text=f"{right:.1f} us of {request * 1e3:.0f} ms"),
        Figure("key check, right key", right, unit="us", at={"keys": KEYS}),
        Figure("key check, wrong key", wrong, unit="us", at={"keys": KEYS}),
    ]


def main() -> None:
    report(f"fair_keys: the key check's cost, {CLIENTS} clients, {KEYS} named keys vs no auth",
           key_cost())


if __name__ == "__main__":
    with run("fair_keys"):
        main()
