"""Placement for real: a 12-layer model too big for either of two nodes (as `--nodes` describes
them) is planned by `exod plan`, with more layers on the node with more room; `exod plan
--write` gives the explicit YAML, which two daemons on this host (node `a` and node `b`, each
running its own rank) load through the config loader and serve: the same greedy text as
in-process mlx-lm."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import openai
import yaml

from tests.harness import EXOD, Daemon, port_block
from tests.integration.test_group_serving import GREEDY, mlx_lm_greedy

QUESTION = "What is the capital of France?"
# 65536 tokens of KV (32 MiB a layer) make one rank of the tiny model need ~776 MiB: neither
# node holds it alone, and together they hold it only split by their room.
NODES = [{"node_id": "a", "name": "a", "backend": "cpu", "memory_usable": "760MiB",
          "addresses": ["127.0.0.1"]},
         {"node_id": "b", "name": "b", "backend": "cpu", "memory_usable": "700MiB",
          "addresses": ["127.0.0.1"]}]


def exod_plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXOD, "plan", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_a_plan_over_two_nodes_written_out_serves_as_one_rank(
        daemons: Callable[..., Daemon], tiny_model_factory: Callable[..., Path],
        tmp_path: Path) -> None:
    model = tiny_model_factory(layers=12)
    key = tmp_path / "cluster.key"
    key.write_text("0123456789abcdef" * 4)
    key.chmod(0o600)
    main = tmp_path / "exod.yaml"
    main.write_text(yaml.safe_dump({"node": {"name": "a"}, "instances": {"big": {
        "model": str(model), "placement": "auto", "shards": 2, "port_base": port_block(3),
        "context_tokens": 65536, "max_concurrency": 1, "cluster_key_file": str(key),
        "peer_timeout": "5s"}}}))
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps(NODES))

    shown = exod_plan("-c", str(main), "--nodes", str(nodes))
    assert shown.returncode == 0, shown.stderr
    head, r0, r1 = shown.stdout.splitlines()
    assert head.startswith("big: pipeline, 2 ranks on 2 nodes; 12 layers")
    # a has more room than b: it holds more layers (an even split would be 6 and 6).
    assert r0.split()[:5] == ["rank", "0", "a", "layers", "0-6"] and "of 760MiB" in r0
    assert r1.split()[:5] == ["rank", "1", "b", "layers", "7-11"] and "of 700MiB" in r1

    placed = tmp_path / "placed.yaml"
    wrote = exod_plan("-c", str(main), "--nodes", str(nodes), "--write", "-o", str(placed))
    assert wrote.returncode == 0, wrote.stderr
    big = yaml.safe_load(placed.read_text())["instances"]["big"]
    assert (big["shards"], big["layers"]) == (2, [7, 5]) and "placement" not in big
    assert [h["name"] for h in big["hosts"]] == ["a", "b"]

    hosts = []
    for name in ("a", "b"):
        d = daemons({"node": {"name": name}, "include": ["placed.yaml"]}, name=f"place-{name}")
        shutil.copy(placed, d.dir / "placed.yaml")  # includes stay in the config's folder
        hosts.append(d.start())
    a, b = hosts
    for d, mine, layers in ((a, 0, [0, 7]), (b, 1, [7, 12])):
        inst = d.until_state("big", "ready")
        local = [r for r in inst["ranks"] if not r["remote"]]
        assert [(r["rank"], r["layers"]) for r in local] == [(mine, layers)]

    client = openai.OpenAI(base_url=a.api_url() + "/v1", api_key="-", max_retries=0, timeout=120)
    r = client.chat.completions.create(model="big", messages=[{"role": "user",
                                                               "content": QUESTION}], **GREEDY)
    assert r.choices[0].message.content == mlx_lm_greedy(model, [QUESTION])[0]


def test_an_auto_instance_on_this_host_runs_the_planner_s_layers(
        daemons: Callable[..., Daemon], tiny_model_factory: Callable[..., Path]) -> None:
    model = tiny_model_factory(layers=12)
    d = daemons({"instances": {"big": {"model": str(model), "placement": "auto", "shards": 2,
                                       "max_concurrency": 2}}}, name="place-here")
    shown = exod_plan("-c", str(d.config_path))
    assert shown.returncode == 0, shown.stderr
    planned = [line.split()[4] for line in shown.stdout.splitlines()[1:]]  # "0-5", "6-11"
    d.start()
    inst = d.until_state("big", "ready")
    assert inst["shards"] == 2
    assert [f"{r['layers'][0]}-{r['layers'][1] - 1}" for r in inst["ranks"]] == planned
    assert d.log_text().count("placement: 2 ranks on this host") >= 1
    client = openai.OpenAI(base_url=d.api_url() + "/v1", api_key="-", max_retries=0, timeout=120)
    r = client.chat.completions.create(model="big", messages=[{"role": "user",
                                                               "content": QUESTION}], **GREEDY)
    assert r.choices[0].message.content == mlx_lm_greedy(model, [QUESTION])[0]
