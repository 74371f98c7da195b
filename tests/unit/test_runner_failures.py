"""What ends a runner early, and its exit code (exod.runner.failures): one table, read by every
kind of runner, the entry point alone turning an exception into a code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from exod.core import exits
from exod.runner import failures
from exod.runner.failures import (AddressInUse, CannotServe, ModelError, PeerLost, Unavailable,
                                  exit_for)
from exod.runner.wired import WiredLimitError

RUNNER = Path(failures.__file__).resolve().parent
MODEL = Path("/models/m")


@pytest.mark.parametrize(("error", "code", "reason"), [
    (ModelError("bad weights"), exits.EXIT_MODEL, "cannot load /models/m: bad weights"),
    (CannotServe("kv_bits is not supported"), exits.EXIT_MODEL,
     "cannot serve /models/m: kv_bits is not supported"),
    (Unavailable("mlx is not usable: no module"), exits.EXIT_UNAVAILABLE,
     "mlx is not usable: no module"),
    (AddressInUse("127.0.0.1:5000"), exits.EXIT_TEMPFAIL,
     "address 127.0.0.1:5000 is in use (another instance or program on its port?)"),
    (PeerLost("rank 1"), exits.EXIT_PEER_LOST,
     "peer lost: rank 1; exiting so the group can form again"),
    (WiredLimitError("too much"), exits.EXIT_MODEL, "cannot load /models/m: too much"),
])
def test_each_failure_has_its_code_and_reason(error: BaseException, code: int,
                                              reason: str) -> None:
    assert isinstance(error, failures.FAILURES)
    assert exit_for(error, MODEL) == (code, reason)


def test_a_permanent_failure_is_one_the_daemon_does_not_retry() -> None:
    permanent = {e.error for e in failures.EXITS if e.code in exits.PERMANENT_EXIT_CODES}
    assert permanent == {ModelError, CannotServe, Unavailable}


def test_only_the_entry_point_and_the_table_name_the_runner_s_exit_codes() -> None:
    """No path of one kind of runner maps exceptions to codes of its own (the group's lost peer
    ends a worker blocked in C itself, with the table's code)."""
    named = sorted(str(p.relative_to(RUNNER)) for p in RUNNER.rglob("*.py")
                   if any(isinstance(n, ast.ImportFrom) and n.module == "exod.core.exits"
                          and any(a.name.startswith("EXIT_") and a.name not in ("EXIT_OK",
                                                                               "EXIT_USAGE")
                                  for a in n.names)
                          for n in ast.walk(ast.parse(p.read_text()))))
    assert named == ["failures.py", "group/membership.py"]
