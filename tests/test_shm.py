"""What killed processes leave in /dev/shm: names no live process holds open or maps are unlinked, names in use
are kept (the scan reads every process, so it runs as root only)."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys

import pytest

from ebpo_verl.ops.shm import CLUSTER_PREFIXES, ORPHAN_PREFIXES, unlink_orphaned_shm


@pytest.mark.skipif(os.geteuid() != 0, reason="the orphan scan reads every process: root only")
def test_only_orphans_of_the_known_prefixes_are_unlinked(tmp_path):
    shm = str(tmp_path)
    names = ("sem.loky-123-abc", "verl_weights_0f", "verl_weights_open", "sem.loky-9-mapped", "psm_x")
    for name in names:
        (tmp_path / name).write_bytes(b"\0" * mmap.PAGESIZE)
    held = open(tmp_path / "verl_weights_open", "rb")  # noqa: SIM115  (held open across the scan)
    fd = os.open(tmp_path / "sem.loky-9-mapped", os.O_RDWR)
    mapped = mmap.mmap(fd, mmap.PAGESIZE)
    os.close(fd)  # only the mapping is left, as after SharedMemory's close of its descriptor
    try:
        unlinked = unlink_orphaned_shm(shm)
    finally:
        held.close()
        mapped.close()
    assert unlinked == [f"{shm}/sem.loky-123-abc", f"{shm}/verl_weights_0f"]
    assert sorted(os.listdir(shm)) == ["psm_x", "sem.loky-9-mapped", "verl_weights_open"]  # vLLM's queues: not ours
    assert unlink_orphaned_shm(shm) == [f"{shm}/sem.loky-9-mapped", f"{shm}/verl_weights_open"]  # released now


def test_nothing_is_unlinked_where_the_scan_would_be_blind(tmp_path, monkeypatch):
    (tmp_path / "verl_weights_x").write_bytes(b"")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert unlink_orphaned_shm(str(tmp_path)) == [] and (tmp_path / "verl_weights_x").exists()


HOLDER = """
import sys, time
if sys.argv[1] == "loky":
    import joblib.externals.loky.backend  # as vLLM's CPU processes do: it names multiprocessing's semaphores loky-*
import multiprocessing as mp
lock = mp.get_context("spawn").Lock()
print(lock._semlock.name, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the orphan scan reads every process: root only")
@pytest.mark.parametrize(("naming", "prefixes"), [("loky", ORPHAN_PREFIXES), ("mp", CLUSTER_PREFIXES)])
def test_a_live_processs_named_semaphore_is_kept_though_mapped_under_another_name(naming, prefixes):
    """The CI failure this guards against: a training driver's clean-up unlinked the named semaphore of a vLLM
    engine starting beside it, whose child then could not open it. glibc maps a new semaphore under a temporary
    name (``sem.XXXXXX (deleted)`` in /proc/PID/maps), so only the inode tells that it is in use."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, naming], stdout=subprocess.PIPE, text=True)
    try:
        name = holder.stdout.readline().strip()
        path = f"/dev/shm/sem.{name.lstrip('/')}"
        assert name.startswith(f"/{naming}-") and path.startswith(tuple(f"/dev/shm/{p}" for p in prefixes)), name
        assert os.path.exists(path)
        maps = open(f"/proc/{holder.pid}/maps").read()  # noqa: SIM115
        assert path not in maps and "/dev/shm/sem." in maps  # the case: mapped, under another name
        assert path not in unlink_orphaned_shm(prefixes=prefixes) and os.path.exists(path)
    finally:
        holder.kill()
        holder.wait()
