"""Time limits of a smoke run, nested so that every inner one ends before the outer one.

From the inside out: each training run (``--run-timeout``), fault injection and waits (their own bounds, capped
by what is left), the script's overall ``--deadline`` (every wait is capped by the time left before it), then
``scripts/cpu_smoke.sh``'s ``timeout`` (``CPU_SMOKE_TIMEOUT``, which passes ``--deadline`` =
``CPU_SMOKE_TIMEOUT - CLEANUP_MARGIN_S``: the script's SIGTERM handler then still has time to stop its cluster),
then the test's subprocess timeout (``CPU_SMOKE_TIMEOUT`` + the ``timeout --kill-after`` grace + a margin), then
the test module's pytest-timeout tier.
:func:`check_order` refuses a set of limits that is not strictly nested.
"""

from __future__ import annotations

import time

ONE_NODE_OUTER_S = 1200
"""CPU_SMOKE_TIMEOUT of the one-node test run (tests/test_cpu_smoke.py; ~350 s in CI, 5.5 min here)."""
TWO_NODE_OUTER_S = 2100
"""CPU_SMOKE_TIMEOUT of the two-node test run (tests/test_cluster.py: four attempts, two planted resumes). Both test
timeouts stay inside the module's pytest-timeout tier (tests/conftest.py ``MODULE_TIMEOUTS_S``), the outermost."""
CLEANUP_MARGIN_S = 120
"""Seconds between the script's deadline and cpu_smoke.sh's ``timeout``: stopping a cluster takes up to ~60 s."""
KILL_AFTER_S = 90
"""cpu_smoke.sh: ``timeout --kill-after`` (SIGKILL this long after the SIGTERM)."""
TEST_MARGIN_S = 60
"""Tests: their subprocess timeout is the outer ``timeout`` + :data:`KILL_AFTER_S` + this."""

_deadline = float("inf")


def set_deadline(seconds: float) -> None:
    """The script's overall deadline, ``seconds`` from now."""
    global _deadline
    _deadline = time.monotonic() + seconds


def left(cap: float) -> float:
    """Seconds a wait may take: ``cap``, or less if the deadline is nearer; raises once it has passed."""
    remaining = _deadline - time.monotonic()
    if remaining <= 0:
        raise SystemExit("[cpu_smoke] the --deadline passed; stopping (raise --deadline or CPU_SMOKE_TIMEOUT)")
    return min(cap, remaining)


def test_timeout(outer_s: int) -> int:
    """A test's subprocess timeout around ``cpu_smoke.sh`` run with ``CPU_SMOKE_TIMEOUT=outer_s``."""
    return outer_s + KILL_AFTER_S + TEST_MARGIN_S


def check_order(run_timeout: float, deadline: float, outer: float | None = None, test: float | None = None) -> None:
    """Raise SystemExit naming the first pair of limits that is not strictly nested (inner < outer)."""
    chain = [("--run-timeout", run_timeout), ("--deadline", deadline)]
    chain += [("cpu_smoke.sh timeout", outer)] if outer is not None else []
    chain += [("test subprocess timeout", test)] if test is not None else []
    for (inner_name, inner), (outer_name, out) in zip(chain, chain[1:], strict=False):
        if not inner < out:
            raise SystemExit(f"[cpu_smoke] {inner_name} {inner:g} s must be shorter than {outer_name} {out:g} s")
