"""What killed processes leave in /dev/shm: names no live process holds open or maps are unlinked, names in use
are kept (the scan reads every process, so it runs as root only)."""

from __future__ import annotations

import mmap
import os

import pytest

from ebpo_verl.ops.shm import unlink_orphaned_shm


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
