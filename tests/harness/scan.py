"""Finding what a smoke run left behind, whoever made it, with scans that prove they see something.

Every process the script starts gets :data:`TAG_ENV` = :data:`TAG` in its environment, inherited by every process
below it (Ray's raylets, GCS, workers, vLLM's engines, loky helpers, also after a ``setsid`` or a double fork):
:func:`tagged_processes` finds them by environment, not by session. A ``/dev/shm`` entry made since the snapshot
taken before the first run, that no live process outside the run holds and that the scans never saw held only by
processes outside the run (a concurrent test's), is the run's leftover, whatever created it.

A :class:`Watch` samples both every 2 s while runs are alive (and right before the script kills one);
:meth:`Watch.final` fails if it never saw a Ray process (or, in a vLLM run, a ``/dev/shm`` segment): a scan that
sees nothing proves nothing. Once every tagged process is gone it unlinks the new entries it saw those processes
hold (by inode), and only those; any other new entry fails the check, except a run's kind of orphan
(:data:`~ebpo_verl.ops.shm.ORPHAN_PREFIXES`) that nobody was seen holding while Ray processes of another run were
alive: a concurrent test's run killed in its weight sync leaves one that no 2 s sample catches held (a clean-clone CI
run saw one beside the campaign test); it is listed, left to that run's own check. Only a process that vanished
between listing and reading is skipped, and an unreadable one older than the script (a container's init); any other
error raises.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil

from ebpo_verl.ops.shm import ORPHAN_PREFIXES, Unreadable, held_files, holders, inodes_by_path, unlink_orphaned_shm

TAG_ENV = "EBPO_SMOKE_TAG"
TAG = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
SHM = Path("/dev/shm")
RAY_NAMES = ("raylet", "gcs_server")
_VANISHED = (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError)
STARTED = psutil.Process().create_time()


def title(proc: psutil.Process) -> str:
    """A process's title (Ray's workers rename themselves ``ray::...``), or its name."""
    cmd = proc.cmdline()
    return cmd[0] if cmd else proc.name()


def is_ray(proc: psutil.Process) -> bool:
    return proc.name() in RAY_NAMES or title(proc).startswith("ray::")


def split_processes(tag: str = TAG) -> tuple[list[psutil.Process], list[int]]:
    """Live processes of this user carrying ``TAG_ENV=tag``, and the pids of the others (this one left out)."""
    uid, me, tagged, others = os.getuid(), os.getpid(), [], []
    for proc in psutil.process_iter():
        try:
            if proc.uids().real != uid or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(TAG_ENV) == tag:
                tagged.append(proc)
            elif proc.pid != me:
                others.append(proc.pid)
        except _VANISHED:
            continue
        except psutil.AccessDenied:
            if proc.create_time() >= STARTED:  # not older than this script: it could be one of its own
                raise
    return tagged, others


def tagged_processes(tag: str = TAG) -> list[psutil.Process]:
    """Live (non-zombie) processes of this user whose environment carries ``TAG_ENV=tag``."""
    return split_processes(tag)[0]


def shm_held(pid: int) -> dict[int, str]:
    """``/dev/shm`` files a process maps or holds open: inode -> path (``(deleted)`` ones included); empty if it
    vanished (:func:`ebpo_verl.ops.shm.held_files`; a live one that cannot be read raises)."""
    return held_files(str(pid), str(SHM), os.stat(SHM).st_dev)


def shm_names() -> set[str]:
    return {entry.name for entry in os.scandir(SHM)}


def titled(procs: list[psutil.Process]) -> Iterator[tuple[psutil.Process, str]]:
    """(process, :func:`title`) of each of ``procs`` still there."""
    for proc in procs:
        try:
            yield proc, title(proc)
        except _VANISHED:
            continue


def describe(procs: list[psutil.Process]) -> list[tuple[int, str]]:
    return [(proc.pid, name[:80]) for proc, name in titled(procs)]


def creator(name: str, titles: dict[int, str]) -> str:
    """The run's process whose pid an entry's name carries (``sem.loky-<pid>-...``), if seen, else "?"."""
    pids = [int(part) for part in re.split(r"[-_.]", name) if part.isdigit()]
    return next((f"made by pid {pid} ({titles[pid]})" for pid in pids if pid in titles), "?")


def leftover_shm(
    before: set[str], now: set[str], held: set[str], seen: dict[str, str], titles: dict[int, str] | None = None
) -> dict[str, str]:
    """New entries of ``now`` (not in ``before``) no other live process holds, each with the run's process seen
    holding it, else :func:`creator`."""
    return {name: seen.get(name) or creator(name, titles or {}) for name in sorted(now - before - held)}


def check_sighted(what: str, ray_seen: int, shm_seen: int, need_shm: bool) -> str:
    """The proof that the scans see: raises if no Ray process (or, ``need_shm``, no segment) was seen."""
    if ray_seen < 1:
        raise AssertionError(f"[cpu_smoke] {what}: the process scan saw no Ray process while the run was alive")
    if need_shm and shm_seen < 1:
        raise AssertionError(f"[cpu_smoke] {what}: the /dev/shm scan saw no segment while the vLLM run was alive")
    return f"the scans saw {ray_seen} Ray processes and {shm_seen} /dev/shm segments while it ran"


def check_none_left(what: str, procs: list[tuple[int, str]], shm: dict[str, str]) -> None:
    """Raises naming every process and ``/dev/shm`` entry left."""
    problems = [f"processes left: {procs}"] if procs else []
    problems += [f"/dev/shm entries left (name: holder seen): {shm}"] if shm else []
    if problems:
        raise AssertionError(f"[cpu_smoke] {what} left things behind: {'; '.join(problems)}")


class Watch:
    """Samples the tagged processes and their ``/dev/shm`` segments every ``period`` seconds from
    :meth:`start` until :meth:`final`; the ``/dev/shm`` snapshot is taken at construction."""

    def __init__(self, what: str, need_shm: bool, tag: str = TAG, period: float = 2.0) -> None:
        self.what, self.need_shm, self.tag, self.period = what, need_shm, tag, period
        self.before = shm_names()
        self.ray_seen: set[int] = set()
        self.shm_seen: dict[str, str] = {}  # name -> title of the first tagged process seen holding it
        self.inodes_seen: dict[int, str] = {}  # the same by inode (a live semaphore is mapped under another name)
        self.titles: dict[int, str] = {}  # pid -> title of every tagged process seen
        self.inodes_foreign: dict[int, str] = {}  # inode -> path, held by a live process of this user not tagged
        self.foreign_ray: set[int] = set()  # Ray processes of this user not tagged: another run's
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def sample(self) -> list[psutil.Process]:
        procs, others = split_processes(self.tag)
        for pid in others:
            try:
                self.inodes_foreign.update(shm_held(pid))
                if is_ray(psutil.Process(pid)):
                    self.foreign_ray.add(pid)
            except (Unreadable, *_VANISHED, psutil.AccessDenied):  # what it holds stays unattributed
                continue
        for proc in procs:
            try:
                if is_ray(proc):
                    self.ray_seen.add(proc.pid)
                holder = self.titles.setdefault(proc.pid, title(proc)[:60])
            except _VANISHED:
                continue
            for inode, path in shm_held(proc.pid).items():
                self.shm_seen.setdefault(Path(path.removesuffix(" (deleted)")).name, holder)
                self.inodes_seen.setdefault(inode, holder)
        return procs

    def sample_now(self) -> None:
        """One sample right before a kill; an error is kept for :meth:`final`, so that the kill still happens."""
        try:
            self.sample()
        except Exception as err:  # noqa: BLE001  (re-raised by final())
            self.error = self.error or err

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.period):
                self.sample()
        except BaseException as err:  # noqa: BLE001  (re-raised by final(): a scan that fails is a failure)
            self.error = err

    def wait_gone(self, seconds: float = 30.0) -> list[tuple[int, str]]:
        """Tagged processes still alive ``seconds`` after the call (empty as soon as none is)."""
        deadline = time.monotonic() + seconds
        while (left := tagged_processes(self.tag)) and time.monotonic() < deadline:
            time.sleep(0.5)
        return describe(left)

    def final(self, grace: float = 30.0) -> str:
        """Stop sampling; raise unless the scans saw the run and nothing of it is left ``grace`` s later."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        if self.error is not None:
            raise AssertionError(f"[cpu_smoke] {self.what}: the leak scan failed: {self.error!r}") from self.error
        seen = check_sighted(self.what, len(self.ray_seen), len(self.shm_seen), self.need_shm)
        procs = self.wait_gone(grace)
        made = {path: inode for path, inode in inodes_by_path(str(SHM)).items() if Path(path).name not in self.before}
        # unlinked once they are gone: the new entries its own processes were seen holding (the module docstring)
        mine = {path: inode for path, inode in made.items() if inode in self.inodes_seen}
        removed = [] if procs else [Path(p).name for p in unlink_orphaned_shm(str(SHM), ("",), seen=mine)]
        foreign = {Path(p).name for p, i in made.items() if i in self.inodes_foreign and i not in self.inodes_seen}
        # held by a live process outside the run, matched by inode (a live semaphore is mapped under another name)
        used = holders(str(SHM), frozenset({p.pid for p in tagged_processes(self.tag)} | {os.getpid()}))[0]
        held = {Path(path).name for path, inode in inodes_by_path(str(SHM)).items() if inode in used} | foreign
        shm = leftover_shm(self.before, shm_names(), held, self.shm_seen, self.titles)
        theirs = [n for n, who in shm.items() if self.foreign_ray and who == "?" and n.startswith(ORPHAN_PREFIXES)]
        check_none_left(self.what, procs, {n: who for n, who in shm.items() if n not in theirs})
        return (
            f"{seen}; none is left, and no /dev/shm entry made since its start is left (of "
            f"{len(self.shm_seen)} seen held by its processes; {len(removed)} left by its killed processes "
            f"unlinked: {removed}; {len(foreign)} made since and seen held only by other processes, not its own, "
            f"left alone; {len(theirs)} run orphans never seen held while {len(self.foreign_ray)} Ray processes of "
            f"other runs lived, left to them: {theirs})"
        )
