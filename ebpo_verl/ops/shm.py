"""vLLM's ``/dev/shm`` ring buffers: their names unlinked once an engine is up, so that none outlives it."""

from __future__ import annotations

import os
from typing import Any


def unlink_engine_shm(_actor: Any = None) -> list[str]:
    """Run in the process that started a vLLM engine, once the engine is up: a verl server actor (vLLM-CPU fix 4 of
    ``ebpo_verl.cpu.backend``) or the evaluation's engine. vLLM's engine process and its worker talk through
    ``multiprocessing.shared_memory`` ring buffers (``/dev/shm/psm_*``, one per message queue: 160-250 MB each
    here), which vLLM unlinks only when the engine shuts down cleanly; a SIGKILL (Ray ending a run's actors, the
    evaluation ending its workers' process groups) left them in /dev/shm (RAM) for good. Once the engine has
    started, every process that uses them has them mapped, so their names can go now: the memory stays mapped
    while the engine lives and the kernel frees it when the last process exits, however it ends. Unlinks the
    ``psm_*`` segments mapped by this process's descendants; returns their paths."""
    import psutil

    paths: set[str] = set()
    for child in psutil.Process().children(recursive=True):
        paths |= _mapped(str(child.pid), " /dev/shm/psm_")
    return _unlink(sorted(p for p in paths if not p.endswith("(deleted)")))


def _unlink(paths: list[str]) -> list[str]:
    """Unlink each path; those unlinked (one gone meanwhile is left out)."""
    unlinked = []
    for path in paths:
        try:
            os.unlink(path)
            unlinked.append(path)
        except FileNotFoundError:
            pass
    return unlinked


ORPHAN_PREFIXES = ("sem.loky-", "verl_weights_")
"""``/dev/shm`` names a training run's processes create and a SIGKILL leaves behind: joblib/loky's semaphores
(vLLM's CPU workers) and verl's weight-sync buffers. Not vLLM's ``psm_*`` queues (:func:`unlink_engine_shm`
unlinks those once an engine is up): clearing them from the driver broke a vLLM engine starting beside the run
(its worker could not open a queue its engine had just made), so the driver leaves them alone."""
CLUSTER_PREFIXES = ("sem.mp-",)
"""Python multiprocessing's named semaphores (spawn/forkserver contexts; their resource tracker unlinks them at
exit unless it is killed too): what a force-stopped Ray cluster leaves (:mod:`ebpo_verl.smoke.cluster`)."""


def _mapped(pid: str, needle: str) -> set[str]:
    """The paths of process ``pid``'s mappings whose line contains ``needle`` (empty when it is gone)."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return {line.split(None, 5)[-1].strip() for line in maps if needle in line}
    except OSError:
        return set()


def _inodes(pid: str, folder: str, dev: int) -> set[int]:
    """The inode numbers of the files of ``folder`` (on device ``dev``) that process ``pid`` maps or holds open.
    By inode, not by name: glibc's ``sem_open`` maps a new named semaphore under a temporary name, links the name
    to it and deletes the temporary one, so ``/proc/PID/maps`` shows a live semaphore as ``/dev/shm/sem.XXXXXX
    (deleted)``, never under its own name. Each descriptor is read on its own (one closed meanwhile must not hide
    the others: a segment just created is held before it is mapped)."""
    found: set[int] = set()
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].startswith(f"{folder}/"):
                    major, minor = (int(x, 16) for x in fields[3].split(":"))
                    if os.makedev(major, minor) == dev:
                        found.add(int(fields[4]))
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if st.st_dev == dev:
            found.add(st.st_ino)
    return found


def inodes_by_path(shm: str = "/dev/shm", prefixes: tuple[str, ...] = ("",)) -> dict[str, int]:
    """The entries of ``shm`` whose names start with one of ``prefixes``: path -> inode number."""
    return {entry.path: entry.inode() for entry in os.scandir(shm) if entry.name.startswith(prefixes)}


def inodes_in_use(shm: str = "/dev/shm", exclude: frozenset[int] = frozenset()) -> set[int]:
    """The inode numbers of the ``shm`` files that a live process of this node (not in ``exclude``) maps or holds
    open: all of them as root; another user's processes are not readable otherwise."""
    dev = os.stat(shm).st_dev
    used: set[int] = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) not in exclude):
        used |= _inodes(pid, shm, dev)
    return used


def unlink_orphaned_shm(shm: str = "/dev/shm", prefixes: tuple[str, ...] = ORPHAN_PREFIXES) -> list[str]:
    """Unlink the segments and semaphores of :data:`ORPHAN_PREFIXES` that no live process holds open or maps:
    what killed processes of earlier runs (or attempts) left in RAM. The driver calls it before and after a run
    (on its own node). Without the rights to read every process (not root), nothing is unlinked: a name another
    user's live process uses would look orphaned. Returns the unlinked paths."""
    if os.geteuid() != 0 or not os.path.isdir(shm):
        return []
    candidates = inodes_by_path(shm, prefixes)
    if not candidates:
        return []
    used = inodes_in_use(shm)
    return _unlink(sorted(path for path, inode in candidates.items() if inode not in used))
