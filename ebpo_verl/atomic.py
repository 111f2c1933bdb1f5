"""Atomic file writes: readers see the old file or the complete new one, never a partial file.

The temporary file is created beside the target with mode ``0o666`` filtered by the process umask (what
``open()`` gives a new file: 0644 under the usual umask 022), unlike ``tempfile.mkstemp``'s private 0600, so
outputs stay readable to other users of a shared filesystem when the umask allows it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """``write(tmp)`` fills a temporary file beside ``path``; it is fsynced and renamed onto ``path``.

    On any failure the temporary file is removed and ``path`` is left as it was. Returns ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask applies, as for open()
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
