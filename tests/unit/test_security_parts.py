"""The pure parts of exod's defences (issue #11): request limits against the model (the rules
themselves: test_request_rules; here, what the API and the runner give them), browser
policies, rate-limited logs, the group's key, trust in directories and
sockets, config safety. Sockets here are socketpairs and files in tmp dirs; no daemon, no mlx.
The same attacks against a live daemon are in tests/integration/test_security.py."""

from __future__ import annotations

import functools
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from exod import trust
from exod.api.browser import CorsPolicy, HostPolicy, host_name, is_json
from exod.api.errors import ApiError
from exod.api.dialects.openai.request import parse_chat, parse_completion
from exod.api.request import ModelLimits, apply_limits
from exod.api.token import read_token, read_tokens
from exod.secret_file import KEY_BYTES, MAX_BYTES, secret_problem
from exod.config import ConfigError, load_config
from exod.facts.model_dir import model_limits
from exod.config.safety import is_public, warnings
from exod.daemon.logs import split_priority
from exod.daemon.rank_addresses import write_private
from exod.daemon.ratelog import RateLimitedLog
from exod.runner.group import control
from exod.runner.serving import model_checks

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
OTHER_UID = 65534  # nobody


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("acting as another user needs root (CI runs the suite as root)")


def api_error(fn, *args) -> ApiError:  # type: ignore[no-untyped-def]
    with pytest.raises(ApiError) as e:
        fn(*args)
    return e.value


# ---- request fields against the model ------------------------------------------------------
def test_logit_bias_ids_must_be_inside_the_vocabulary() -> None:
    req = parse_chat({**CHAT, "logit_bias": {"1023": 5, "0001": -5}})
    assert req.gen.logit_bias == {"1023": 5.0, "1": -5.0}  # normalised ids
    assert apply_limits(req, ModelLimits(vocab=1024)) is req
    bad = parse_chat({**CHAT, "logit_bias": {"1024": 100}})
    e = api_error(apply_limits, bad, ModelLimits(vocab=1024))
    assert e.status == 400 and e.param == "logit_bias" and "1024" in e.message
    assert e.body()["error"]["type"] == "invalid_request_error"


def test_max_tokens_is_clamped_to_the_context_window_and_the_cap() -> None:
    """The rule is exod.core.request_rules.max_tokens_cap; here, what the API gives it. Past
    the window or the cap, a value is clamped (issue 27: agents send 32000 everywhere)."""
    limits = ModelLimits(vocab=1024, context=2048)
    for body, parse in ((CHAT, parse_chat), ({"model": "m", "prompt": "x"}, parse_completion)):
        assert apply_limits(parse({**body, "max_tokens": 10**12}), limits).gen.max_tokens == \
            2048
        assert apply_limits(parse({**body, "max_tokens": 2048}), limits).gen.max_tokens == 2048
    assert apply_limits(parse_chat({**CHAT, "max_completion_tokens": 9}),
                        ModelLimits(context=2048, cap=8)).gen.max_tokens == 8
    assert apply_limits(parse_chat(CHAT), ModelLimits(context=100)).gen.max_tokens == 100
    assert apply_limits(parse_chat(CHAT), ModelLimits()).gen.max_tokens == 1024


def test_model_limits_read_from_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "llava", "text_config": {"vocab_size": 500, "n_positions": 64}}))
    assert model_limits(tmp_path) == (500, 64)
    (tmp_path / "config.json").write_text('{"vocab_size": true}')
    assert model_limits(tmp_path) == (None, None)


def test_context_window_from_the_model_arguments() -> None:
    class Model:
        def __init__(self, args: object) -> None:
            self.args = args

    class Args:
        max_position_embeddings = 4096
        rope_scaling = {"type": "yarn", "factor": 4.0}

    assert model_checks.context_window(Model(Args())) == 16384  # RoPE stretched on purpose
    assert model_checks.context_window(Model({"n_positions": 512})) == 512  # gpt2: a table
    text = type("A", (), {"text_config": {"max_position_embeddings": 8192}})()
    assert model_checks.context_window(Model(text)) == 8192  # under a multimodal model's args
    assert model_checks.context_window(Model({"n_positions": True})) is None
    assert model_checks.context_window(object()) is None
    assert model_checks.model_vocab(Model({"text_config": {"vocab_size": 1024}})) == 1024
    assert model_checks.model_vocab(Model({"vocab_size": 0})) is None


def test_a_temperature_past_float32_is_greedy() -> None:
    assert model_checks.greedy_temperature(0.0) and model_checks.greedy_temperature(1e-39)
    assert model_checks.greedy_temperature(5e-324)
    assert not model_checks.greedy_temperature(1e-30) and not model_checks.greedy_temperature(2.0)


# ---- browser ---------------------------------------------------------------------------------
def test_host_policy_refuses_foreign_names_but_not_ip_literals() -> None:
    p = HostPolicy(["127.0.0.1"], ["exod.lan"])
    for ok in ("127.0.0.1:52415", "localhost:52415", "[::1]:80", "10.1.2.3", "exod.lan:8000",
               "EXOD.LAN.", "app.localhost", None):
        assert p.allows(ok), ok
    for bad in ("attacker.example:52415", "evil.com", "127.0.0.1.nip.io"):
        assert not p.allows(bad), bad
    assert HostPolicy(["0.0.0.0"], ["*"]).allows("anything.example")
    assert host_name("[fe80::1]:80") == "fe80::1"


def test_json_content_type_and_cors() -> None:
    assert is_json("application/json") and is_json("Application/JSON; charset=utf-8")
    assert not is_json("text/plain") and not is_json("") and not is_json("application/jsonx")
    off = CorsPolicy([])
    assert not off.enabled and not off.allows("https://a.example")
    on = CorsPolicy(["https://app.example/"])
    assert on.allows("https://app.example") and not on.allows("https://evil.example")
    assert not on.allows(None)


# ---- logs --------------------------------------------------------------------------------------
def test_rate_limited_log_counts_what_it_mutes() -> None:
    now = [0.0]
    log = RateLimitedLog(interval=10, clock=lambda: now[0])
    assert log.allow("emfile") == 0
    assert [log.allow("emfile") for _ in range(1000)] == [None] * 1000
    assert log.allow("other") == 0  # per cause
    now[0] = 10.0
    assert log.allow("emfile") == 1000


@pytest.mark.parametrize("line, level, text", [
    ("<3>bad", "ERROR", "bad"), ("<9>x", "INFO", "<9>x"), ("<a>x", "INFO", "<a>x"),
    ("<", "INFO", "<"), ("<7>", "DEBUG", ""), ("<٣>x", "INFO", "<٣>x"),
])
def test_runner_log_prefix_never_raises(line: str, level: str, text: str) -> None:
    assert split_priority(line) == (level, text)


# ---- the group's key (its handshake and messages: tests/unit/test_group_wire.py) -----------
def test_cluster_key_comes_from_a_file(tmp_path: Path) -> None:
    key = tmp_path / "k"
    with pytest.raises(control.ControlLost, match="the group key: cannot read"):
        control.cluster_key(key)
    key.write_bytes(b"short\n")
    key.chmod(0o600)
    with pytest.raises(control.ControlLost, match="fewer than 16 bytes"):
        control.cluster_key(key)
    key.write_bytes(b"a" * 40 + b"\n")
    assert control.cluster_key(key) == b"a" * 40
    key.chmod(0o644)
    assert secret_problem(key, KEY_BYTES) is not None and "chmod 600" in str(
        secret_problem(key, KEY_BYTES))
    key.chmod(0o600)
    assert secret_problem(key, KEY_BYTES) is None


def test_every_secret_file_has_one_rule(tmp_path: Path) -> None:
    """The API's tokens, the hub's token and a group's key, each as its reader and `exod
    check` read it: a regular file closed to other users (its group may read it), not empty,
    at most a MiB. They had three rules: owner only, not every user, and none at all."""
    from exod.hub.__main__ import read_token as hub_token

    f = tmp_path / "secret"
    f.write_text("k" * 32 + "\n")

    def verdicts() -> list[str | None]:
        out: list[str | None] = []
        for read in (lambda: read_tokens(f), lambda: hub_token(f), lambda: control.cluster_key(f)):
            try:
                read()
                out.append(None)
            except (OSError, control.ControlLost) as e:
                out.append(str(e))
        return [*out, secret_problem(f), secret_problem(f, KEY_BYTES)]

    for mode in (0o600, 0o640, 0o400, 0o660):
        f.chmod(mode)
        assert verdicts() == [None] * 5, oct(mode)
    for mode in (0o644, 0o604, 0o602, 0o666):
        f.chmod(mode)
        said = verdicts()
        why = (f"{f} has mode {mode:04o}: a secret must be closed to other users (chmod 600 "
               f"{f}, or 640 to let its group read it)")
        assert all(s is not None and s.endswith(why) for s in said), said
    f.chmod(0o600)
    f.write_bytes(b"x" * (MAX_BYTES + 1))
    assert all(s is not None and "larger than" in s for s in verdicts())
    f.unlink()
    os.mkfifo(f, 0o600)  # would block a plain open()
    assert all(s is not None and s.endswith("is not a regular file") for s in verdicts())


# ---- trust in directories and sockets ---------------------------------------------------
def test_private_dir_is_created_private_and_never_loosened(tmp_path: Path) -> None:
    d = tmp_path / "run"
    trust.ensure_private_dir(d, group_access=False)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    trust.ensure_private_dir(tmp_path / "shared", group_access=True)
    assert stat.S_IMODE(os.stat(tmp_path / "shared").st_mode) == 0o750
    # An existing folder is adopted as it is (it may be shared, like /run) ...
    d.chmod(0o755)
    trust.ensure_private_dir(d, group_access=False)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o755
    # ... unless others may write in it: they could swap the socket.
    for loose in (0o777, 0o1777, 0o770):
        d.chmod(loose)
        with pytest.raises(trust.Untrusted, match="may be written by other users"):
            trust.ensure_private_dir(d, group_access=False)
        assert stat.S_IMODE(os.stat(d).st_mode) == loose


def test_private_dir_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    need_root()
    d = tmp_path / "exod-0"
    d.mkdir(mode=0o777)
    os.chown(d, OTHER_UID, OTHER_UID)
    with pytest.raises(trust.Untrusted, match="belongs to"):
        trust.ensure_private_dir(d, group_access=False)
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(trust.Untrusted, match="not a directory"):
        trust.ensure_private_dir(link, group_access=False)


def test_exoctl_trusts_only_sockets_in_our_own_dirs(tmp_path: Path) -> None:
    need_root()
    tmp_path.chmod(0o1777)  # like /tmp: anyone may create entries
    hijack = tmp_path / "exod-0"
    hijack.mkdir()
    hijack.chmod(0o777)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(hijack / "control.sock"))
    os.chown(hijack, OTHER_UID, OTHER_UID)
    problem = trust.socket_problem(hijack / "control.sock")
    assert problem is not None and "belongs to" in problem
    os.chown(hijack, 0, 0)
    problem = trust.socket_problem(hijack / "control.sock")
    assert problem is not None and "writable by every user" in problem
    hijack.chmod(0o700)
    assert trust.socket_problem(hijack / "control.sock") is None
    s.close()
    (hijack / "plain").write_text("")
    assert "not a socket" in str(trust.socket_problem(hijack / "plain"))


def test_peer_credentials_of_a_unix_connection() -> None:
    a, b = socket.socketpair()
    with a, b:
        assert trust.peer_creds(a) == (os.geteuid(), os.getegid())
    policy = trust.ClientPolicy(gid=None)
    assert policy.allows(os.geteuid(), 12345) and policy.allows(0, 0)
    assert not policy.allows(OTHER_UID, OTHER_UID)
    assert trust.ClientPolicy(gid=OTHER_UID).allows(4242, OTHER_UID)


def test_bind_unix_gives_the_mode_before_the_name_exists(tmp_path: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    with s:
        trust.bind_unix(s, tmp_path / "c.sock", 0o600)
        assert stat.S_IMODE(os.lstat(tmp_path / "c.sock").st_mode) == 0o600
        assert [p.name for p in tmp_path.iterdir()] == ["c.sock"]  # no temporary left


def test_private_files_are_written_o_excl_in_a_private_dir(tmp_path: Path) -> None:
    path = tmp_path / "groups" / "pp.json"
    write_private(path, b"[]")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    # A symlink planted under the old, predictable temporary name is never followed.
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (path.parent / ".pp.json.tmp").symlink_to(victim)
    write_private(path, b"[1]")
    assert victim.read_text() == "keep" and path.read_bytes() == b"[1]"


# ---- config safety -------------------------------------------------------------------------
def write_config(tmp_path: Path, text: str) -> Path:
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2}')
    main = tmp_path / "exod.yaml"
    main.write_text(text)
    return main


def test_include_is_confined_to_the_config_tree(tmp_path: Path) -> None:
    outside = tmp_path / "outside.yaml"
    outside.write_text("instances:\n  stolen: {model: m}\nsecret: hunter2\n")
    conf = tmp_path / "etc"
    conf.mkdir()
    (conf / "d").mkdir()
    (conf / "d" / "link.yaml").symlink_to(outside)
    main = write_config(conf, f"include: [{outside}, d/*.yaml]\ninstances: {{}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(main)
    text = str(e.value)
    assert text.count("is outside") == 2 and "hunter2" not in text and "stolen" not in text


def test_control_socket_must_not_name_a_regular_file(tmp_path: Path) -> None:
    victim = tmp_path / "precious.txt"
    victim.write_text("data")
    main = write_config(tmp_path, f"control: {{socket: {victim}}}\ninstances: {{}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(main)
    assert f"exod.yaml:1:19: control.socket: {victim} exists and is a file" in str(e.value)
    assert victim.read_text() == "data"


def test_unsafe_but_valid_settings_are_warned_about(tmp_path: Path) -> None:
    main = write_config(tmp_path, "api: {listen: '0.0.0.0:8000'}\ncontrol: {mode: '0666'}\n"
                                  "instances: {}\n")
    cfg = load_config(main)
    got = warnings(cfg)
    assert len(got) == 2 and "refuses this unless api.insecure_public" in got[0]
    assert "every user" in got[1]
    assert is_public("[::]:1") and is_public("example.com:1") and not is_public("[::1]:1")
    assert not is_public("localhost:1") and not is_public("127.0.0.2:1") and not is_public("")


def test_token_file_holds_several_tokens(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text("# comment\nalpha\n\n  beta  \n")
    f.chmod(0o600)
    assert read_tokens(f) == ["alpha", "beta"] and read_token(f) == "alpha"
    f.write_text("# only a comment\n")
    with pytest.raises(OSError, match="holds no token"):
        read_tokens(f)
    f.write_bytes("tök\n".encode())
    with pytest.raises(OSError, match="printable ASCII") as e:
        read_tokens(f)
    assert "tök" not in str(e.value)


def test_exod_raises_its_open_files_limit_to_the_hard_one() -> None:
    script = ("import resource; from exod.daemon.limits import raise_nofile; "
              "print(raise_nofile(), resource.getrlimit(resource.RLIMIT_NOFILE))")
    out = subprocess.run(["prlimit", "--nofile=512:4096", "--", sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "(512, 4096) (4096, 4096)"


# ---- bounded queues: a client that does not read is dropped, never buffered for --------------
def test_a_request_stream_drops_a_client_that_reads_too_slowly() -> None:
    from exod.wire import messages as m
    from exod.daemon.channel import MAX_PENDING, RequestStream

    sent: list[object] = []

    class FakeLink:
        def send(self, msg: object) -> bool:
            sent.append(msg)
            return True

    stream = RequestStream(FakeLink(), "r1")  # type: ignore[arg-type]
    for i in range(MAX_PENDING + 10):
        stream._put(m.Text("r1", f"t{i}"))
    assert stream.finished and sent == [m.Cancel("r1")]  # the runner stops generating
    assert stream._queue.qsize() == 1  # what was buffered is gone: only the error is left
    last = stream._queue.get_nowait()
    assert isinstance(last, m.Error) and last.code == "aborted"


def test_wait_and_watch_queues_are_bounded() -> None:
    import asyncio

    from exod.daemon.commands import MAX_QUEUED, _offer

    q: asyncio.Queue[dict[str, object]] = asyncio.Queue(MAX_QUEUED)
    overflow: list[bool] = []
    made: list[int] = []

    def snapshot(i: int) -> dict[str, object]:
        made.append(i)
        return {"n": i}

    for i in range(MAX_QUEUED * 3):
        _offer(q, overflow, functools.partial(snapshot, i))
    assert q.qsize() == MAX_QUEUED and overflow == [True]
    assert len(made) == MAX_QUEUED  # no snapshot is even made for a client being dropped


def test_port_base_in_the_ephemeral_range_is_warned_about(tmp_path: Path) -> None:
    from exod.config.safety import ephemeral_overlaps

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 4}')
    key = tmp_path / "cluster.key"
    key.write_text("k" * 32)
    key.chmod(0o600)
    main = write_config(tmp_path, (
        "node: {name: a}\n"
        "instances:\n"
        f"  low: {{model: {model}, shards: 2, port_base: 6100}}\n"
        f"  high: {{model: {model}, shards: 2, port_base: 40000}}\n"
        f"  edge: {{model: {model}, shards: 2, port_base: 32766}}\n"
        f"  remote: {{model: {model}, shards: 2, port_base: 32867, cluster_key_file: {key}, "
        "hosts: [{name: b, address: 10.0.0.2}, {name: a, address: 10.0.0.1}]}\n"))
    cfg = load_config(main)
    got = ephemeral_overlaps(cfg, (32768, 60999))
    assert [w.split(": ", 2)[1] for w in got] == ["instances.high.port_base",
                                                  "instances.edge.port_base",
                                                  "instances.remote.port_base"], got
    assert got[0].startswith(f"{main}:4:")
    assert "40000, 40001, 40002 lie in this host's ephemeral port range 32768-60999" in got[0]
    assert "port(s) 32768 lie" in got[1]  # only rank 0's control port is inside
    assert "port(s) 32868 lie" in got[2]  # rank 0 and its control port are on host b
    assert ephemeral_overlaps(cfg, (61000, 65535)) == []
