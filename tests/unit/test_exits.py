"""Exit statuses and the exit-code protocol between runner and daemon."""

from __future__ import annotations

import os
import signal

import pytest

from exod.core import exits
from exod.core.exits import PERMANENT_EXIT_CODES, ExitInfo, signal_name


def exited(code: int) -> int:
    """A wait status as waitpid returns it for exit(code)."""
    return (code & 0xFF) << 8


def killed(sig: int, core: bool = False) -> int:
    return sig | (0x80 if core else 0)


@pytest.mark.parametrize("code", [0, 1, 3, 65, 78, 255])
def test_from_wait_status_exit_codes(code: int) -> None:
    status = exited(code)
    assert os.waitstatus_to_exitcode(status) == code  # the status is a real one
    info = ExitInfo.from_wait_status(status)
    assert info == ExitInfo(code=code, signal=None)


@pytest.mark.parametrize(("sig", "core"), [
    (signal.SIGKILL, False), (signal.SIGTERM, False), (signal.SIGSEGV, True),
    (signal.SIGABRT, True), (signal.SIGINT, False),
])
def test_from_wait_status_signals(sig: int, core: bool) -> None:
    status = killed(sig, core)
    assert os.waitstatus_to_exitcode(status) == -sig
    assert ExitInfo.from_wait_status(status) == ExitInfo(code=None, signal=int(sig))


@pytest.mark.parametrize(("info", "text", "clean", "permanent"), [
    (ExitInfo(code=0), "exit code 0", True, False),
    (ExitInfo(code=1), "exit code 1", False, False),
    (ExitInfo(code=65), "exit code 65", False, True),
    (ExitInfo(code=75), "exit code 75", False, False),
    (ExitInfo(signal=9), "signal 9 (SIGKILL)", False, False),
    (ExitInfo(signal=15), "signal 15 (SIGTERM)", False, False),
    (ExitInfo(signal=200), "signal 200 (SIG200)", False, False),
], ids=str)
def test_text_clean_permanent(info: ExitInfo, text: str, clean: bool, permanent: bool) -> None:
    assert str(info) == text
    assert info.clean is clean
    assert info.permanent is permanent
    assert info.to_json() == {"code": info.code, "signal": info.signal, "text": text}


def test_permanent_codes_are_the_sysexits_that_retrying_cannot_fix() -> None:
    assert PERMANENT_EXIT_CODES == {64, 65, 69, 78}
    assert exits.EXIT_TEMPFAIL not in PERMANENT_EXIT_CODES
    assert (exits.EXIT_USAGE, exits.EXIT_MODEL, exits.EXIT_UNAVAILABLE, exits.EXIT_CONFIG) == (
        64, 65, 69, 78)


def test_signal_name() -> None:
    assert signal_name(9) == "SIGKILL"
    assert signal_name(2) == "SIGINT"
    assert signal_name(0xBEEF) == f"SIG{0xBEEF}"
