"""ebpo_verl.ops.locking: one holder at a time, the refusal names the holder, a killed holder leaves no stale lock."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from ebpo_verl.ops import locking
from ebpo_verl.ops.locking import LockHeldError, exclusive_lock

HOLD = """
import sys, time
from ebpo_verl.ops.locking import exclusive_lock
with exclusive_lock(sys.argv[1], what="the test output"):
    print("locked", flush=True)
    time.sleep(120)
"""


def _holder(lock) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_holder_in_same_process_refused_then_free(tmp_path):
    lock = tmp_path / "sub" / "out.lock"
    with exclusive_lock(lock, what="out"):
        assert lock.is_file()
        with pytest.raises(LockHeldError, match=rf"out is in use by pid {os.getpid()} on "):
            with exclusive_lock(lock, what="out"):
                pass
    assert not lock.exists()  # released and removed
    with exclusive_lock(lock, what="out"):
        pass


def test_other_process_refused_naming_pid_host_and_start(tmp_path):
    lock = tmp_path / "out.lock"
    proc = _holder(lock)
    try:
        with pytest.raises(LockHeldError) as err:
            with exclusive_lock(lock, what="the test output"):
                pass
        msg = str(err.value)
        assert "\n" not in msg
        assert f"pid {proc.pid} on {socket.gethostname()}, started 20" in msg
        assert str(lock) in msg
    finally:
        proc.kill()
        proc.wait()


def test_lock_of_a_killed_holder_is_free(tmp_path):
    """SIGKILL runs no cleanup: the lock file stays, but the OS dropped the lock with the process."""
    lock = tmp_path / "out.lock"
    proc = _holder(lock)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert lock.is_file()
    start = time.monotonic()
    with exclusive_lock(lock, what="out"):
        assert f'"pid": {os.getpid()}' in lock.read_text()
    assert time.monotonic() - start < 5


def test_a_holder_record_past_its_bounds_is_not_quoted(tmp_path):
    """Before: a lock file whose host was 200k characters gave a 200k-character "one-line" refusal."""
    from ebpo_verl.ops.errors import MESSAGE_LIMIT

    lock = tmp_path / "x.lock"
    for record, named in (({"pid": 7, "host": "h" * 200_000, "started": "t"}, False),
                          ({"pid": 10**400, "host": "h", "started": "t"}, False),
                          ({"pid": 7, "host": "h" * 64, "started": "t" * 32}, True)):  # fmt: skip
        with locking.exclusive_lock(lock, what="out"):
            lock.write_text(json.dumps(record))
            with pytest.raises(locking.LockHeldError) as err, locking.exclusive_lock(lock, what="out"):
                pass
        message = str(err.value)
        assert ("pid 7 on " + "h" * 64 in message) is named and len(message) <= MESSAGE_LIMIT, message[:400]
        assert named or "a process that has not recorded itself yet" in message
