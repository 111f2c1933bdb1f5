"""One writer per output: an exclusive advisory lock held by the process for the length of a ``with`` block.

``with exclusive_lock(lock_file, what="generations file results/gen.jsonl"):`` takes ``flock(LOCK_EX)`` on
``lock_file`` without waiting. The lock belongs to the open file, so the operating system drops it when the
holder exits or is killed (a crash never leaves a stale lock); the pid, host and start time written into the
file are only there to name the holder in the refusal another process gets (:class:`LockHeldError`).
Leaving the block removes the lock file. The lock is advisory (it binds only processes that take it) and, as
``flock`` is, per open file: a second ``exclusive_lock`` on the same file in the same process is refused too.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ebpo_verl.ops.errors import OneLineMessage


class LockHeldError(OneLineMessage, RuntimeError):
    """Another process holds the lock; the message names it and what to do."""


PID_END = 2**31
"""A pid is a ``pid_t``: an int in [1, 2**31)."""
HOST_MAX = 64
"""The longest host name a holder's record may give (Linux's HOST_NAME_MAX)."""
STARTED_MAX = 32
"""The longest start time a holder's record may give (the lock writes an ISO 8601 time of 25 characters)."""


def _holder(path: Path) -> str:
    """The holder the lock file records (a pid in [1, 2**31), a host of at most :data:`HOST_MAX` and a start time of
    at most :data:`STARTED_MAX` printable characters): "pid P on H, started T"; for anything else (being written,
    torn, not such a record) "a process that has not recorded itself yet"."""
    pid = host = started = None
    with suppress(OSError, ValueError, KeyError, TypeError, RecursionError):  # JSON's errors, non-UTF-8: ValueErrors
        info = json.loads(path.read_text(encoding="utf-8"))
        pid, host, started = info["pid"], info["host"], info["started"]
    named = isinstance(pid, int) and not isinstance(pid, bool) and 1 <= pid < PID_END
    if named and _text(host, HOST_MAX) and _text(started, STARTED_MAX):
        return f"pid {pid} on {host}, started {started}"
    return "a process that has not recorded itself yet"


def _text(value: object, most: int) -> bool:
    """Printable text of at most ``most`` characters."""
    return isinstance(value, str) and len(value) <= most and value.isprintable()


@contextmanager
def exclusive_lock(path: str | os.PathLike, what: str) -> Iterator[Path]:
    """Hold an exclusive lock on ``path`` (created if absent) inside the block; yields ``path``. ``what`` names the
    guarded output in the :class:`LockHeldError` another process gets."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LockHeldError(
                f"{what} is in use by {_holder(path)} (lock file {path}); "
                "wait for that process to end or stop it, or use another output"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        with suppress(FileNotFoundError):  # removed by a holder releasing it between our open and flock: retry
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        os.close(fd)
    try:
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}) + "\n"
        with suppress(OSError):  # e.g. a full disk: the lock holds all the same, a refusal just cannot name the holder
            os.ftruncate(fd, 0)
            os.pwrite(fd, record.encode("utf-8"), 0)
        yield path
    finally:
        try:
            path.unlink(missing_ok=True)  # unlink before unlocking: a waiter that opened it retries (inode check)
        finally:
            os.close(fd)
