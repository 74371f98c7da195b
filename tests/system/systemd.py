"""A real systemd (252 on Debian 12) booted as PID 1 of private namespaces, for system tests on
machines whose own PID 1 is not systemd. No containers, no VM: `unshare` + a cgroup2 child.

    with SystemdGuest(tmp_path) as g:
        g.install_unit("exod.service", text)
        g.daemon_reload()
        g.systemctl("start", "exod", check=True)
        g.show("exod", "StatusText")
        g.journal("exod")

What the guest shares with the host, and what it does not:
  * shared: the root filesystem (so the repo's venv runs inside), /dev, the user namespace
  * private: pid, mount, uts, ipc, cgroup and (by default) network namespaces; tmpfs on /run,
    /tmp, /var/tmp, /var/lib, /var/cache and /var/log; /etc is an overlay whose writes land in
    the harness's folder (so `systemd-sysusers` can add the `exod` user, and
    ConfigurationDirectory= can create /etc/exod, without touching the host's /etc).
  * never visible to the guest manager: the host's unit folders and generators. Only the units
    in `self.units` exist, and the default target is our own empty one, so no host service can
    start and systemd-tmpfiles never runs.

Boot recipe: /work/shared/notes/systemd-in-namespaces.md. Every process here is one we start;
cleanup kills only the guest's PID 1 (which takes its namespace down) and removes our cgroups.
"""

from __future__ import annotations

import ctypes
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

SYSTEMD = "/lib/systemd/systemd"
JOURNALD = "/lib/systemd/systemd-journald"
CGROUP_PREFIX = "exod-systemd-test"
GUEST_DIR = "/run/exod-test"  # where the harness folder is bind-mounted inside the guest
DEFAULT_TARGET = "exod-test.target"
# Environment of every command run inside the guest: nothing of pytest's leaks in (in
# particular no NOTIFY_SOCKET, VIRTUAL_ENV or PYTHONPATH).
GUEST_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "SYSTEMD_PAGER": "",
    "SYSTEMD_COLORS": "0",
    "SYSTEMD_LOG_COLOR": "0",
}
PR_SET_PDEATHSIG = 1
SAFETY = 60.0  # seconds: only a bound against hangs


class GuestUnavailable(RuntimeError):
    """This machine refuses to create the namespaces (e.g. unprivileged CI): tests skip."""


class GuestError(RuntimeError):
    """The guest failed to boot or misbehaved; the message carries its console and state."""


# ---- the guest's own units ---------------------------------------------------------------------
# A minimal set written for this harness: just enough targets for the manager to boot to our
# default target and to shut down through `systemctl exit`, plus journald so that service output
# is captured. Nothing here is copied from the host's /lib/systemd/system.
def _target(description: str, extra: str = "") -> str:
    return f"[Unit]\nDescription={description}\nDefaultDependencies=no\n{extra}"


BASE_UNITS: dict[str, str] = {
    DEFAULT_TARGET: _target("exod test guest", "Requires=basic.target\nAfter=basic.target\n"
                            "Wants=systemd-journald.service\nAllowIsolate=yes\n"),
    "sysinit.target": _target("System initialization (guest)"),
    "sockets.target": _target("Sockets (guest)"),
    "basic.target": _target("Basic system (guest)", "Requires=sysinit.target\n"
                            "Wants=sockets.target\nAfter=sysinit.target sockets.target\n"),
    "shutdown.target": _target("Shutdown (guest)", "RefuseManualStart=yes\n"),
    "umount.target": _target("Unmount all (guest)", "RefuseManualStart=yes\n"),
    # Mount units of the (host's) mounts refer to these; empty here.
    "local-fs-pre.target": _target("Local file systems, early (guest)"),
    "local-fs.target": _target("Local file systems (guest)"),
    "swap.target": _target("Swaps (guest)"),
    "final.target": _target("Late shutdown (guest)", "RefuseManualStart=yes\n"
                            "After=shutdown.target umount.target\n"),
    "exit.target": _target("Exit the guest", "Requires=systemd-exit.service\n"
                           "After=systemd-exit.service\nAllowIsolate=yes\n"),
    # SuccessAction=exit-force: once every unit has stopped, PID 1 exits ("Exiting container.").
    "systemd-exit.service": _target("Exit the guest manager", "Requires=shutdown.target\n"
                                    "After=shutdown.target\nSuccessAction=exit-force\n"),
}

JOURNAL_UNITS: dict[str, str] = {
    "systemd-journald.socket": _target(
        "Journal sockets (guest)", "Before=sockets.target\n\n[Socket]\n"
        "ListenStream=/run/systemd/journal/stdout\nListenDatagram=/run/systemd/journal/socket\n"
        "SocketMode=0666\nPassCredentials=yes\nPassSecurity=yes\nReceiveBuffer=8M\n"
        "Service=systemd-journald.service\n"),
    "systemd-journald.service": _target(
        "Journal service (guest)", "Requires=systemd-journald.socket\n"
        "After=systemd-journald.socket\nBefore=sysinit.target\n\n[Service]\nType=notify\n"
        f"Sockets=systemd-journald.socket\nExecStart={JOURNALD}\nRestart=always\nRestartSec=0\n"
        "StandardOutput=null\nFileDescriptorStoreMax=4224\n"),
}

# Volatile storage (never the host's /var/log/journal) and no rate limit (tests read every line).
# ReadKMsg=no: the host's kernel ring buffer is not the guest's business.
JOURNALD_CONF = ("[Journal]\nStorage=volatile\nRateLimitIntervalSec=0\nRateLimitBurst=0\n"
                 "ReadKMsg=no\nForwardToSyslog=no\nForwardToKMsg=no\nForwardToConsole=no\n"
                 "ForwardToWall=no\n")

# Stage 1 runs as PID 1 of the new pid namespace: it moves only itself into the guest cgroup (its
# parent, unshare, stays outside, or systemd fails to move "remaining userspace processes"),
# then enters a new cgroup namespace rooted there.
STAGE1 = """\
set -eu
echo 0 > "$1/cgroup.procs"
exec unshare --cgroup /bin/sh "$2/stage2.sh" "$2"
"""

# Stage 2 prepares the mount namespace and execs the manager with a clean environment.
STAGE2 = """\
set -eu
H="$1"
mount --make-rprivate /
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
if [ -e /proc/sysrq-trigger ]; then
    mount --bind /proc/sysrq-trigger /proc/sysrq-trigger
    mount -o remount,bind,ro /proc/sysrq-trigger
fi
mount -o remount,bind,ro /sys
umount -R /sys/fs/cgroup
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$H/etc-upper,workdir=$H/etc-work" /etc
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
mkdir -p {guest_dir}
mount --bind "$H" {guest_dir}
{keep_before}
for d in /tmp /var/tmp; do mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$d"; done
for d in /var/lib /var/cache /var/log; do mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$d"; done
{keep_after}
{journald}
mount --bind "$(cat {guest_dir}/console)" /dev/console
# /dev is the host's: keep the guest's logging out of the host's kernel ring buffer.
mount --bind /dev/null /dev/kmsg
{etc_units}
exec env -i container=exod-test \\
    SYSTEMD_UNIT_PATH={unit_path} \\
    SYSTEMD_GENERATOR_PATH={guest_dir}/empty \\
    SYSTEMD_ENVIRONMENT_GENERATOR_PATH={guest_dir}/empty \\
    setpriv --bounding-set -sys_module,-sys_time \\
    {systemd} --system --unit={target} --show-status=no
"""

JOURNALD_SETUP = """\
mkdir -p /run/systemd/journald.conf.d
cp {guest_dir}/journald.conf /run/systemd/journald.conf.d/exod-test.conf
"""


# ---- cgroups -------------------------------------------------------------------------------------
def cgroup2_root() -> Path:
    """Where the host mounts cgroup2 (/sys/fs/cgroup on unified hosts, .../unified on hybrid)."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                return Path(left.split()[4].replace("\\040", " "))
    raise GuestError("no cgroup2 mount in /proc/self/mountinfo")


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (FileNotFoundError, IndexError):
        return None


def _owner_tag() -> str:
    """`<pid>-<start time>`: tells a live harness from a dead one whose pid was reused."""
    return f"{os.getpid()}-{_start_time(os.getpid())}"


def remove_cgroup(path: Path, timeout: float = 10.0) -> None:
    """rmdir bottom-up. A cgroup that still has processes (EBUSY) is retried until `timeout`:
    after PID 1 of the guest dies the kernel needs a moment to reap its namespace."""
    deadline = time.monotonic() + timeout
    while True:
        busy = None
        for dirpath, _dirs, _files in os.walk(path, topdown=False):
            try:
                os.rmdir(dirpath)
            except FileNotFoundError:
                pass
            except OSError as e:
                busy = e
        if busy is None or time.monotonic() > deadline:
            if busy is not None:
                raise GuestError(f"cannot remove cgroup {path}: {busy}")
            return
        time.sleep(0.02)


def remove_stale_cgroups(root: Path) -> list[Path]:
    """Remove the cgroups left by harnesses that died (e.g. SIGKILLed pytest); keep live ones."""
    removed = []
    for d in root.glob(f"{CGROUP_PREFIX}.*"):
        m = re.fullmatch(rf"{re.escape(CGROUP_PREFIX)}\.(\d+)-(\d+)\.\d+", d.name)
        if m is None or _start_time(int(m.group(1))) == m.group(2):
            continue
        try:
            remove_cgroup(d, timeout=1.0)
            removed.append(d)
        except GuestError:
            pass  # still populated: not ours to kill
    return removed


# ---- the guest -----------------------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)  # loaded here: nothing may dlopen between fork and exec


def _pdeathsig_kill() -> None:
    """In the unshare child before exec: SIGKILL when the thread that started it dies (a killed
    pytest), which makes unshare --kill-child take the whole guest down. Start guests from
    pytest's main thread: a short-lived thread as parent would kill the guest when it ends."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


_counter = 0


class SystemdGuest:
    """One throw-away system manager. Use as a context manager, or start()/exit()."""

    def __init__(self, workdir: Path, *, host_network: bool = False, journald: bool = True,
                 boot_timeout: float = SAFETY, etc_units: bool = False) -> None:
        global _counter
        _counter += 1
        self.dir = Path(workdir)
        self.units = self.dir / "units"
        self.console_log = self.dir / "console.log"
        # Default: a private network namespace with only lo (up), so ports never collide.
        self.host_network = host_network
        self.journald = journald
        self.boot_timeout = boot_timeout
        # etc_units: /etc/systemd/system is an empty tmpfs of the guest's own, and on the
        # manager's unit path, so that `exod install` and `systemctl enable` work as on a host
        # (the host's own units there stay invisible).
        self.etc_units = etc_units
        self.cgroup = cgroup2_root() / f"{CGROUP_PREFIX}.{_owner_tag()}.{_counter}"
        self.pid = 0  # guest PID 1, as the host sees it
        self.boot_seconds = 0.0
        self._proc: subprocess.Popen[bytes] | None = None
        self._pty_master = -1
        self._drain: threading.Thread | None = None
        self._booted = False

    # ---- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> SystemdGuest:  # noqa: PYI034 (py3.10 has no typing.Self)
        try:
            self.start()
        except BaseException:
            self.exit()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.exit()

    def start(self) -> SystemdGuest:
        probe_unshare()
        remove_stale_cgroups(self.cgroup.parent)
        self._prepare_dir()
        self.cgroup.mkdir()
        master, slave = os.openpty()
        self._pty_master = master
        (self.dir / "console").write_text(os.ttyname(slave))
        ns = ["--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--uts", "--ipc"]
        if not self.host_network:
            ns.append("--net")
        t0 = time.monotonic()
        try:
            self._proc = subprocess.Popen(
                ["unshare", *ns, "/bin/sh", str(self.dir / "stage1.sh"), str(self.cgroup),
                 str(self.dir)],
                stdin=slave, stdout=slave, stderr=slave, env=GUEST_ENV, cwd="/",
                preexec_fn=_pdeathsig_kill,  # noqa: PLW1509 (no thread runs yet)
                start_new_session=True)
        finally:
            os.close(slave)
        # Drained by a thread started only now: no thread may run while preexec_fn does.
        self._drain = threading.Thread(target=self._drain_console, daemon=True)
        self._drain.start()
        self.pid = self._find_pid1()
        self._wait_manager(t0)
        self._booted = True
        self.boot_seconds = time.monotonic() - t0
        return self

    def _prepare_dir(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for sub in ("units", "empty", "etc-upper", "etc-work"):
            (self.dir / sub).mkdir(exist_ok=True)
        units = {**BASE_UNITS, **(JOURNAL_UNITS if self.journald else {})}
        for name, text in units.items():
            (self.units / name).write_text(text)
        (self.dir / "journald.conf").write_text(JOURNALD_CONF)
        (self.dir / "stage1.sh").write_text(STAGE1)
        before, after = keep_visible()
        (self.dir / "stage2.sh").write_text(STAGE2.format(
            guest_dir=GUEST_DIR, systemd=SYSTEMD, target=DEFAULT_TARGET,
            journald=JOURNALD_SETUP.format(guest_dir=GUEST_DIR) if self.journald else "",
            keep_before=before, keep_after=after,
            etc_units=("mount -t tmpfs -o mode=0755 tmpfs /etc/systemd/system"
                       if self.etc_units else ""),
            unit_path=f"{GUEST_DIR}/units" + (":/etc/systemd/system" if self.etc_units else "")))

    def _drain_console(self) -> None:
        with open(self.console_log, "ab", buffering=0) as out:
            while True:
                try:
                    data = os.read(self._pty_master, 65536)
                except OSError:  # EIO: every slave end is closed
                    return
                if not data:
                    return
                out.write(data)

    def _find_pid1(self) -> int:
        """The unshare child: PID 1 of the new pid namespace (stage 1, then systemd)."""
        assert self._proc is not None
        deadline = time.monotonic() + self.boot_timeout
        path = Path(f"/proc/{self._proc.pid}/task/{self._proc.pid}/children")
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise GuestError(f"unshare exited {self._proc.returncode}\n{self.console()}")
            try:
                children = path.read_text().split()
            except FileNotFoundError:
                children = []
            if children:
                return int(children[0])
            time.sleep(0.002)
        raise GuestError(f"no guest PID 1 after {self.boot_timeout}s\n{self.console()}")

    def _wait_manager(self, t0: float) -> None:
        """Until the manager answers and the boot is over: `running`, else a GuestError."""
        private = Path(f"/proc/{self.pid}/root/run/systemd/private")
        deadline = t0 + self.boot_timeout
        while not private.exists():
            if self._proc is None or self._proc.poll() is not None or time.monotonic() > deadline:
                raise GuestError(f"the guest manager never opened its socket\n{self.console()}")
            time.sleep(0.005)
        self.wait_running(max(1.0, deadline - time.monotonic()))

    def wait_running(self, timeout: float = SAFETY) -> None:
        res = self.systemctl("is-system-running", "--wait", timeout=timeout)
        state = res.stdout.strip()
        if state != "running":
            raise GuestError(f"guest is {state!r}, not running\n{self.diagnostics()}")

    def exit(self, timeout: float = SAFETY) -> None:
        """`systemctl exit` (every unit stops with its own KillMode/TimeoutStopSec), falling back
        to SIGKILL of the guest's PID 1; then remove our cgroups bottom-up. Idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            exiting = False
            if self._booted:
                try:
                    exiting = self.systemctl("exit", timeout=10).returncode == 0
                except subprocess.TimeoutExpired:
                    pass
            try:
                proc.wait(timeout if exiting else 0.01)
            except subprocess.TimeoutExpired:
                self.kill()
                proc.wait(10)
        if self._pty_master >= 0:
            if self._drain is not None:
                self._drain.join(2)
            os.close(self._pty_master)
            self._pty_master = -1
        if self.cgroup.exists():
            remove_cgroup(self.cgroup)

    def kill(self) -> None:
        """SIGKILL the guest's PID 1, which the kernel follows by killing its whole namespace
        (or, before PID 1 is known, our unshare, whose --kill-child does the same)."""
        if self._proc is None or self._proc.poll() is not None:
            return
        try:
            os.kill(self.pid or self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # ---- inside the guest ------------------------------------------------------------------------
    def run(self, *cmd: str, check: bool = False, timeout: float = SAFETY,
            input: str | None = None, env: Mapping[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run a command in every namespace of the guest (as root, cwd /, a clean env)."""
        res = subprocess.run(self.argv(*cmd), check=False, capture_output=True, text=True,
                             timeout=timeout, input=input, env={**GUEST_ENV, **(env or {})},
                             cwd="/")
        if check and res.returncode != 0:
            raise GuestError(f"`{shlex.join(cmd)}` exited {res.returncode}\n{res.stdout}"
                             f"{res.stderr}")
        return res

    def argv(self, *cmd: str) -> list[str]:
        """The host-side command line that runs `cmd` in every namespace of the guest."""
        return ["nsenter", "-t", str(self.pid), "-m", "-p", "-u", "-i", "-n", "-C", "--root",
                "--wd=/", *cmd]

    def popen(self, *cmd: str, env: Mapping[str, str] | None = None
              ) -> subprocess.Popen[str]:
        """Like run(), in the background: e.g. a `systemctl start` that is expected to block.
        The caller waits for it (or kills it: only this Popen's own pid)."""
        return subprocess.Popen(self.argv(*cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**GUEST_ENV, **(env or {})}, cwd="/")

    def systemctl(self, *args: str, check: bool = False, timeout: float = SAFETY
                  ) -> subprocess.CompletedProcess[str]:
        return self.run("systemctl", "--no-pager", "--no-ask-password", *args, check=check,
                        timeout=timeout)

    def install_unit(self, name: str, text: str) -> Path:
        """Write a unit into the guest's only unit folder (call daemon_reload() afterwards)."""
        path = self.units / name
        path.write_text(text)
        return path

    def install_dropin(self, unit: str, name: str, text: str) -> Path:
        d = self.units / f"{unit}.d"
        d.mkdir(exist_ok=True)
        path = d / (name if name.endswith(".conf") else f"{name}.conf")
        path.write_text(text)
        return path

    def daemon_reload(self) -> None:
        self.systemctl("daemon-reload", check=True)

    def show(self, unit: str, prop: str) -> str:
        return self.properties(unit, prop)[prop]

    def properties(self, unit: str, *props: str) -> dict[str, str]:
        res = self.systemctl("show", unit, *(f"--property={p}" for p in props), check=True)
        out = {}
        for line in res.stdout.splitlines():
            k, _, v = line.partition("=")
            out[k] = v
        return out

    def wait_property(self, unit: str, prop: str, value: str, timeout: float = SAFETY) -> None:
        """Poll `systemctl show` until `prop` == `value`; GuestError with diagnostics if not."""
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            seen = self.show(unit, prop)
            if seen == value:
                return
            time.sleep(0.02)
        raise GuestError(f"{unit} {prop}={seen!r}, expected {value!r} within {timeout}s\n"
                         f"{self.diagnostics(unit)}")

    def journal(self, unit: str | None = None, *args: str, output: str = "cat") -> str:
        """The guest journal (of one unit, if given) as text; `output="short"` for timestamps."""
        sel = ["-u", unit] if unit else []
        res = self.run("journalctl", "--no-pager", "--quiet", "-o", output, *sel, *args)
        return res.stdout

    def wait_journal(self, unit: str, text: str, timeout: float = SAFETY) -> str:
        """journald reads service streams asynchronously: wait until `text` has arrived."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.journal(unit)
            if text in out:
                return out
            if time.monotonic() > deadline:
                raise GuestError(f"{text!r} not in the journal of {unit} within {timeout}s\n"
                                 f"{out}")
            time.sleep(0.05)

    def path(self, guest_path: str) -> Path:
        """The host's view of a path inside the guest's mount namespace."""
        return Path(f"/proc/{self.pid}/root") / guest_path.lstrip("/")

    def write(self, guest_path: str, text: str, mode: int = 0o644) -> None:
        p = self.path(guest_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        p.chmod(mode)

    # ---- reporting -------------------------------------------------------------------------------
    def console(self, tail: int = 60) -> str:
        if not self.alive and self._drain is not None:
            self._drain.join(1)  # the guest is gone: let the drain reach the end of its output
        try:
            text = self.console_log.read_bytes().decode(errors="replace")
        except FileNotFoundError:
            return "(no console output)"
        lines = text.replace("\r\n", "\n").splitlines()
        return "--- guest console ---\n" + "\n".join(lines[-tail:])

    def diagnostics(self, unit: str | None = None) -> str:
        parts = [self.console()]
        if self.alive:
            parts.append(self.systemctl("list-units", "--all", "--no-legend").stdout)
            if unit:
                parts.append(self.systemctl("status", unit).stdout)
                parts.append("--- journal ---\n" + self.journal(unit, output="short-monotonic"))
        return "\n".join(parts)


def probe_unshare() -> None:
    """Raise GuestUnavailable if this machine refuses the namespaces the guest needs."""
    if shutil.which("unshare") is None or not Path(SYSTEMD).exists():
        raise GuestError(f"unshare or {SYSTEMD} is missing: install util-linux and systemd")
    res = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "--mount",
                          "--mount-proc", "--uts", "--ipc", "--cgroup", "true"],
                         check=False, capture_output=True, text=True, timeout=SAFETY)
    if res.returncode != 0:
        if "Operation not permitted" in res.stderr:
            raise GuestUnavailable(f"unshare refused (EPERM), so no systemd guest can boot here: "
                                   f"{res.stderr.strip()}")
        raise GuestError(f"unshare failed: {res.stderr.strip()}")


# ---- exod's shipped unit, in the guest -----------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]
UNIT_FILE = REPO / "packaging" / "systemd" / "exod.service"
SYSUSERS_FILE = REPO / "packaging" / "systemd" / "exod.sysusers"
SHIPPED_EXOD = "/usr/bin/exod"
VENV_EXOD = Path(sys.executable).parent / "exod"
CONFIG_PATH = "/etc/exod/exod.yaml"  # the shipped ExecStart's -c, unchanged
FAKE_MODEL = "/var/lib/exod-test/fake-model"  # guest-private tmpfs; not hidden by the hardening
HIDDEN_BY_PROTECT_HOME = ("/home", "/root", "/run/user")


def with_venv_exod(text: str, exod: Path = VENV_EXOD) -> str:
    """Adaptation 1 of 2: ExecStart runs this checkout's venv `exod` instead of /usr/bin/exod,
    where a package installs it. The arguments (`run -c /etc/exod/exod.yaml`) stay."""
    new, n = re.subn(rf"^ExecStart={re.escape(SHIPPED_EXOD)} ", f"ExecStart={exod} ", text,
                     flags=re.MULTILINE)
    if n != 1:
        raise ValueError(f"{UNIT_FILE} has no `ExecStart={SHIPPED_EXOD} ...` line to adapt")
    return new


MASKED = ("/tmp", "/var/tmp", "/var/lib", "/var/cache", "/var/log")  # private tmpfs in the guest


def keep_visible() -> tuple[str, str]:
    """Shell lines for stage 2: the checkout, its venv and the interpreter must stay visible in
    the guest even when they live under a folder the guest masks with a tmpfs (a CI clone in
    /tmp, say). Each is bound aside (under the guest dir) before the masks, and back after."""
    need = sorted({os.path.realpath(p) for p in (REPO, sys.prefix, sys.base_prefix)})
    masked = [p for p in need if any(p == m or p.startswith(m + "/") for m in MASKED)]
    before = [f"mkdir -p {GUEST_DIR}/keep/{i} && mount --bind '{p}' {GUEST_DIR}/keep/{i}"
              for i, p in enumerate(masked)]
    after = [f"mkdir -p '{p}' && mount --bind {GUEST_DIR}/keep/{i} '{p}'"
             for i, p in enumerate(masked)]
    return "\n".join(before), "\n".join(after)


def hidden_prefixes() -> list[str]:
    """What exod needs from this checkout that ProtectHome=yes would hide: the interpreter's
    prefix (here a pyenv Python under /root), the venv, the repo (PYTHONPATH of the doubles)."""
    need = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, REPO)}
    return sorted(p for p in need
                  if any(p == h or p.startswith(h + "/") for h in HIDDEN_BY_PROTECT_HOME))


def adapt_exod_unit(text: str, exod: Path = VENV_EXOD) -> str:
    """The shipped exod.service as the guest runs it. Only paths are adapted:

    1. ExecStart: the venv's exod (with_venv_exod).
    2. Only when hidden_prefixes() is not empty: ProtectHome=yes would hide the interpreter and
       exod could not even be executed, so ProtectHome=tmpfs (homes are still empty) plus
       BindReadOnlyPaths= of exactly those folders, read-only. An installed exod lives in
       /usr or /opt and needs neither (see the unit's header).
    3. Likewise PrivateTmp=yes, when the checkout is under /tmp (a CI clone): a read-only
       BindReadOnlyPaths= of it into the service's private /tmp.

    NOT adapted, because they work in the guest as shipped: User=/Group=exod (install_exod()
    creates the user with systemd-sysusers from exod.sysusers, in the guest's private /etc
    overlay: the host's /etc/passwd is never touched), the config path /etc/exod/exod.yaml
    (written into that same private /etc), RuntimeDirectory/StateDirectory/ConfigurationDirectory
    (private tmpfs /run and /var/lib, overlay /etc), every hardening option and every timeout.
    """
    text = with_venv_exod(text, exod)
    binds = hidden_prefixes()
    if binds:
        text = _replace_line(text, "ProtectHome=yes",
                             "ProtectHome=tmpfs\nBindReadOnlyPaths=" + " ".join(binds))
    private = in_private_tmp()
    if private:
        text = _replace_line(text, "PrivateTmp=yes",
                             "PrivateTmp=yes\nBindReadOnlyPaths=" + " ".join(private))
    return text


def _replace_line(text: str, line: str, new: str) -> str:
    """`line` (exactly one in the unit) replaced by `new`; a ValueError when it is missing."""
    text, n = re.subn(rf"^{re.escape(line)}$", lambda _: new, text, flags=re.MULTILINE)
    if n != 1:
        raise ValueError(f"{UNIT_FILE} has no `{line}` line to adapt")
    return text


def in_private_tmp() -> list[str]:
    """What exod needs from this checkout that PrivateTmp=yes would hide (a CI clone in /tmp):
    bound read-only into the service's private /tmp."""
    need = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, REPO)}
    return sorted(p for p in need
                  if any(p.startswith(t + "/") for t in ("/tmp", "/var/tmp")))


def install_exod(g: SystemdGuest, config: str | None = None) -> None:
    """Install exod as a package would: sysusers entry applied, unit in place and enabled,
    config in /etc.

    Enabled as `systemctl enable` would, but wanted by the guest's default target (the guest has
    no multi-user.target; the .wants link lives in the guest's own unit folder). Enabling does
    not start it. It matters for tests: an inactive unit that nothing references is garbage-
    collected at once, and `systemctl show` then describes a freshly loaded unit (Result=success,
    every timestamp 0), so a stop's real Result= would be unreadable."""
    g.write("/etc/sysusers.d/exod.conf", SYSUSERS_FILE.read_text())
    g.run("systemd-sysusers", "/etc/sysusers.d/exod.conf", check=True)
    g.write(f"{FAKE_MODEL}/config.json", '{"model_type": "llama", "num_hidden_layers": 4}\n')
    g.install_unit("exod.service", adapt_exod_unit(UNIT_FILE.read_text()))
    # The runner doubles (tests/doubles/runner.py) are chosen by the daemon's own environment.
    g.install_dropin("exod.service", "test-runners", "[Service]\nEnvironment="
                     f"EXOD_RUNNER_MODULE=tests.doubles.runner PYTHONPATH={REPO}\n")
    wants = g.units / f"{DEFAULT_TARGET}.wants"
    wants.mkdir(exist_ok=True)
    link = wants / "exod.service"
    if not link.is_symlink():
        link.symlink_to("../exod.service")
    if config is not None:
        g.write(CONFIG_PATH, config)
    g.daemon_reload()


def double_config(behaviour: str = "cooperative", name: str = "fake", extra: str = "") -> str:
    """A config with one instance served by the runner double (tests/doubles/runner.py)."""
    return (f"{extra}instances:\n  {name}:\n    model: {FAKE_MODEL}\n"
            f"    env: {{EXOD_DOUBLE: {behaviour}}}\n")


if __name__ == "__main__":  # a manual check: boot, print timings, exit
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        t = time.monotonic()
        with SystemdGuest(Path(tmp)) as g:
            print(f"booted in {g.boot_seconds:.3f}s, pid1 {g.pid}", file=sys.stderr)
            print(g.systemctl("list-units", "--all", "--no-legend").stdout)
            print(g.show(DEFAULT_TARGET, "ActiveState"))
            t_exit = time.monotonic()
        print(f"exit {time.monotonic() - t_exit:.3f}s, total {time.monotonic() - t:.3f}s",
              file=sys.stderr)
