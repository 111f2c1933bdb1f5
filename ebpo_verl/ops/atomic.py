"""Atomic file writes: readers see the old file or the complete new one, never a partial file.

The temporary file is created beside the target with mode ``0o666`` filtered by the process umask (what
``open()`` gives a new file: 0644 under the usual umask 022), unlike ``tempfile.mkstemp``'s private 0600, so
outputs stay readable to other users of a shared filesystem when the umask allows it.

A write that fails for want of space raises :class:`DiskFullError`, one line naming the file and the space left
(:func:`reporting_full_disk` gives other writers the same).
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(OSError):
    """No space (or quota) left while writing a file; ``str()`` is one line naming the file and the free space."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror

    def __reduce__(self) -> tuple:  # pickles across worker processes with its message
        return (type(self), (self.strerror,))


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest existing ancestor (the root at the latest)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _free_space(path: Path) -> str:
    """``"12.3 MiB free"`` on the file system that holds ``path`` (its nearest existing folder)."""
    try:
        free = float(shutil.disk_usage(_nearest_existing(path.parent)).free)
    except OSError:
        return "free space unknown"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if free < 1024 or unit == "TiB":
            break
        free /= 1024
    return f"{free:.0f} bytes free" if unit == "bytes" else f"{free:.1f} {unit} free"


@contextmanager
def reporting_full_disk(path: str | os.PathLike) -> Iterator[None]:
    """Turn an ENOSPC/EDQUOT ``OSError`` raised inside the block into :class:`DiskFullError` naming ``path``."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as e:
        if e.errno not in _FULL:
            raise
        path = Path(path)
        raise DiskFullError(
            f"no space left on the device writing {path} ({_free_space(path)} in {path.parent}); "
            "free some space or write elsewhere, then re-run"
        ) from None


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """``write(tmp)`` fills a temporary file beside ``path``; it is fsynced and renamed onto ``path``.

    On any failure the temporary file is removed and ``path`` is left as it was; a full disk is a
    :class:`DiskFullError`. Returns ``path``.
    """
    path = Path(path)
    with reporting_full_disk(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask applies, as for open()
        try:
            write(tmp)
            with open(tmp, "rb") as written:
                os.fsync(written.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def unwritable_reason(target: Path, *, folder: bool = False) -> str | None:
    """Why ``target`` (a file, or with ``folder`` a folder) cannot be written, tried up front by creating and
    removing a probe file (``os.access`` says yes to root even where ``chattr +i`` refuses); None: it can. A
    missing folder is judged by its nearest existing parent; nothing is left behind either way."""
    target = Path(target)
    where = _nearest_existing(target if folder else target.parent)
    if not where.is_dir():
        return f"{where} is not a folder"
    probe = where / f".write-probe-{secrets.token_hex(6)}"
    try:
        probe.touch(exist_ok=False)
        probe.unlink()
        if not folder and target.exists():
            with open(target, "a"):
                pass
    except OSError as err:
        return f"cannot write {target if not folder and target.exists() else where}: {err.strerror}"
    return None
