"""Reload with real runners: added start, removed stop through the ladder, changed restart,
unchanged keep their pid; an invalid file changes nothing."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any
from collections.abc import Callable

import yaml

from tests.harness import Daemon, pid_alive
from tests.integration.conftest import double_env


def pids(d: Daemon) -> dict[str, int | None]:
    return {i["name"]: i["ranks"][0]["pid"] for i in d.status()["instances"]}


def all_ready(names: set[str]) -> Callable[[dict[str, Any]], bool]:
    def pred(snap: dict[str, Any]) -> bool:
        states = {i["name"]: i["state"] for i in snap["instances"]}
        return set(states) == names and all(s == "ready" for s in states.values())

    return pred


def test_reload_applies_a_diff(daemons: Callable[..., Daemon], tiny_model: Path) -> None:
    m = str(tiny_model)
    d = daemons({"include": ["instances.d/*.yaml"],
                 "instances": {"keep": {"model": m}, "edit": {"model": m}}})
    drop_in = d.dir / "instances.d"
    drop_in.mkdir()
    (drop_in / "gone.yaml").write_text(yaml.safe_dump({"instances": {"gone": {"model": m}}}))
    d.start()
    d.watch_until(all_ready({"keep", "edit", "gone"}), what="three ready instances")
    before = pids(d)

    cfg = yaml.safe_load(d.config_path.read_text())
    cfg["instances"]["edit"]["env"] = {"EXOD_TEST_MARK": "2"}
    d.write_config(cfg)
    (drop_in / "gone.yaml").unlink()
    (drop_in / "new.yaml").write_text(yaml.safe_dump({"instances": {"new": {"model": m}}}))

    res = d.ctl("reload")
    assert "added: new" in res.stdout and "removed: gone" in res.stdout
    assert "changed: edit" in res.stdout

    d.watch_until(all_ready({"keep", "edit", "new"}), what="keep, edit, new ready; gone gone")
    after = pids(d)
    assert after["keep"] == before["keep"], "an unchanged instance must keep its runner"
    assert after["edit"] != before["edit"]
    assert not pid_alive(before["gone"]) and not pid_alive(before["edit"])
    for name in ("gone", "edit"):
        steps = [e["extra"]["step"] for e in d.events(event="ladder", instance=name)]
        assert steps == ["ask"], f"{name} must leave through rung 1, got {steps}"
    assert d.events(event="ladder", instance="keep") == []
    assert d.terminate() == 0


def test_invalid_reload_changes_nothing(daemons: Callable[..., Daemon], tiny_model: Path) -> None:
    d = daemons({"instances": {"a": {"model": str(tiny_model)}}})
    d.start()
    d.watch_until(all_ready({"a"}))
    before = pids(d)
    good = d.config_path.read_text()
    mark = d.listener.count()

    d.write_config(good + "    shards: lots\n  b:\n    model: /does/not/exist\n")
    res = d.ctl("reload", check=False)
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    assert f"{d.config_path}:6:13: instances.a.shards:" in res.stderr
    assert f"{d.config_path}:8:12: instances.b.model:" in res.stderr
    assert "nothing was changed" in res.stderr

    # The service manager saw RELOADING=1 then READY=1, with the failure in STATUS.
    reloading = d.listener.wait_for(lambda f: f.get("RELOADING") == "1", start=mark)
    assert int(reloading["MONOTONIC_USEC"]) > 0
    ready = d.listener.wait_for(lambda f: f.get("READY") == "1", start=mark)
    assert "reload failed" in ready["STATUS"]
    assert pids(d) == before and d.instance("a")["state"] == "ready"
    assert d.events(event="ladder") == []

    # SIGHUP is the same reload: fix the file, add an instance.
    d.write_config(good + "  b:\n    model: " + str(tiny_model) + "\n")
    d.send_signal(signal.SIGHUP)
    d.watch_until(all_ready({"a", "b"}), what="b added by SIGHUP")
    assert pids(d)["a"] == before["a"]
    assert d.terminate() == 0


def stubborn_x(daemons: Callable[..., Daemon], fake_model: Path) -> tuple[Daemon, int]:
    """A daemon whose ready instance `x` ignores everything, so that a stop of it lasts the
    whole (3.5 s) ladder: time for a test to act while it runs. Returns (daemon, x's pid)."""
    ladder = {"grace": "3s", "attempts": 1, "interval": "500ms", "kill_interval": "200ms"}
    d = daemons({"instances": {"x": {"model": str(fake_model), "stop": ladder,
                                     "env": double_env("stubborn")}}})
    d.start()
    return d, d.until_state("x", "ready")["ranks"][0]["pid"]


def test_a_second_reload_during_a_stop_wins(daemons: Callable[..., Daemon],
                                            fake_model: Path) -> None:
    """Reload 1 changes `x` (its stubborn runner takes the whole ladder to go), reload 2 removes
    it before that stop is over: the latest config is what ends up applied."""
    d, pid = stubborn_x(daemons, fake_model)
    cfg = yaml.safe_load(d.config_path.read_text())
    cfg["instances"]["x"]["env"]["EXOD_TEST_MARK"] = "2"
    d.write_config(cfg)
    assert "changed: x" in d.ctl("reload").stdout
    assert d.instance("x")["state"] == "stopping"  # the ladder is still running
    del cfg["instances"]["x"]
    cfg["instances"]["y"] = {"model": str(fake_model), "env": double_env("cooperative")}
    d.write_config(cfg)
    assert "removed: x" in d.ctl("reload").stdout

    d.watch_until(lambda s: [i["name"] for i in s["instances"]] == ["y"]
                  and s["instances"][0]["state"] == "ready", what="x gone, y ready")
    assert not pid_alive(pid)
    assert d.terminate() == 0


def test_start_during_a_reload_stop_starts_the_new_config_only(
        daemons: Callable[..., Daemon], fake_model: Path) -> None:
    """`exoctl start x` while a reload is stopping x's old runner: once it is gone, only the
    replacement runs (the old runtime, out of the table, must never spawn again)."""
    d, pid = stubborn_x(daemons, fake_model)
    cfg = yaml.safe_load(d.config_path.read_text())
    cfg["instances"]["x"]["env"] = double_env("cooperative")
    d.write_config(cfg)
    assert "changed: x" in d.ctl("reload").stdout
    assert "x: stopping" in d.ctl("start", "x").stdout

    new = d.until_instance("x", lambda i: i["state"] == "ready" and i["ranks"][0]["pid"] != pid)
    assert not pid_alive(pid)
    started = [e for e in d.events(event="state", instance="x")
               if e["extra"]["new"] == "starting"]
    assert len(started) == 2, d.log_text()  # the first start, then the replacement's only
    assert d.terminate() == 0
    assert new["ranks"][0]["pid"] not in (None, pid)
