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


class LockHeldError(RuntimeError):
    """Another process holds the lock; the message names it and what to do."""


def _holder(path: Path) -> str:
    """The holder the lock file records (a pid >= 1, a host and a start time, printable): "pid P on H, started T";
    for anything else (being written, torn, not such a record) "a process that has not recorded itself yet"."""
    pid = host = started = None
    with suppress(OSError, ValueError, KeyError, TypeError, RecursionError):  # JSON's errors, non-UTF-8: ValueErrors
        info = json.loads(path.read_text(encoding="utf-8"))
        pid, host, started = info["pid"], info["host"], info["started"]
    named = isinstance(pid, int) and not isinstance(pid, bool) and pid >= 1
    if named and isinstance(host, str) and isinstance(started, str) and host.isprintable() and started.isprintable():
        return f"pid {pid} on {host}, started {started}"
    return "a process that has not recorded itself yet"


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
