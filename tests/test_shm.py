"""What killed processes leave in /dev/shm: names no live process holds open or maps are unlinked, names in use
are kept (the scan reads every process, so it runs as root only), and nothing is unlinked when a live process could
not be read or another PID namespace could share /dev/shm unseen.

On this project's machines the init process (pid 1, a VM agent) has capabilities our root lacks (CAP_SYS_PTRACE),
so its maps cannot be read and the clean-up unlinks nothing there (asserted below). The tests of the holder logic
therefore set aside unreadable processes that started before the test session (``sees_all``): the processes
under test are the test's own, all readable. The smoke harness's rule (``seen``: only entries it saw its own,
now dead, processes hold) is tested here at the function, and with its watch in tests/test_smoke_checks.py."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys

import psutil
import pytest

from ebpo_verl.ops import shm as shm_mod
from ebpo_verl.ops.shm import ORPHAN_PREFIXES, unlink_orphaned_shm

SESSION_START = psutil.Process().create_time()


def _unreadable_now() -> dict[int, str]:
    return shm_mod.holders("/dev/shm")[1]


@pytest.fixture
def sees_all(monkeypatch):
    """:func:`holders` without the unreadable processes older than this test process (this VM's init), and no
    namespace blind spot (a CI container's): the holder logic under test, not the machine."""
    real = shm_mod.holders
    monkeypatch.setattr(shm_mod, "blind_spot", lambda: None)

    def holders(shm="/dev/shm", exclude=frozenset()):
        used, unreadable = real(shm, exclude)
        return used, {pid: why for pid, why in unreadable.items() if psutil.Process(pid).create_time() >= SESSION_START}

    monkeypatch.setattr(shm_mod, "holders", holders)


@pytest.mark.skipif(os.geteuid() != 0, reason="the orphan scan reads every process: root only")
def test_only_orphans_of_the_known_prefixes_are_unlinked(tmp_path, sees_all):
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
@pytest.mark.parametrize(("naming", "prefixes"), [("loky", ORPHAN_PREFIXES), ("mp", ("sem.mp-",))])
def test_a_live_processs_named_semaphore_is_kept_though_mapped_under_another_name(naming, prefixes, sees_all):
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


def _orphan_and_holder(tmp_path):
    """An orphan (no holder) and a file a child process holds open and maps."""
    (tmp_path / "verl_weights_orphan").write_bytes(b"\0" * mmap.PAGESIZE)
    (tmp_path / "verl_weights_held").write_bytes(b"\0" * mmap.PAGESIZE)
    code = ("import mmap, sys, time\nf = open(sys.argv[1], 'r+b')\nm = mmap.mmap(f.fileno(), 0)\n"
            "print('ready', flush=True)\ntime.sleep(120)")  # fmt: skip
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "verl_weights_held")],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout.readline().strip() == "ready"
    return holder


@pytest.mark.skipif(os.geteuid() != 0, reason="the orphan scan reads every process: root only")
@pytest.mark.parametrize("error", [PermissionError, FileNotFoundError])
def test_an_unreadable_live_holder_stops_the_clean_up_and_a_vanished_one_does_not(tmp_path, monkeypatch, capsys,
                                                                                   sees_all, error):  # fmt: skip
    """The holder's /proc/PID/maps cannot be read: PermissionError (alive, unknown) -> nothing is unlinked, not
    even the orphan; FileNotFoundError (it exited meanwhile) -> it holds nothing, the orphan goes. The holder
    really holds its file (the unpatched scan keeps it), so only the error decides."""
    holder = _orphan_and_holder(tmp_path)
    real = shm_mod._read_maps

    def read_maps(pid):
        if int(pid) == holder.pid:
            raise error(13 if error is PermissionError else 2, "simulated", f"/proc/{pid}/maps")
        return real(pid)

    try:
        assert unlink_orphaned_shm(str(tmp_path)) == [f"{tmp_path}/verl_weights_orphan"]  # the scan sees the holder
        (tmp_path / "verl_weights_orphan").write_bytes(b"")
        monkeypatch.setattr(shm_mod, "_read_maps", read_maps)
        unlinked = unlink_orphaned_shm(str(tmp_path))
        if error is PermissionError:
            assert unlinked == [] and (tmp_path / "verl_weights_orphan").exists()
            assert capsys.readouterr().err == (
                f"ebpo-verl: kept 2 {tmp_path} entries that may be orphaned (sem.loky-*, verl_weights_*): 1 live "
                f"processes could not be read (pid {holder.pid}: [Errno 13] simulated: '/proc/{holder.pid}/maps'), so "
                "a live holder could be missed\n"
            )
            assert shm_mod.holders(str(tmp_path))[1] == {holder.pid: f"pid {holder.pid}: [Errno 13] simulated: "
                                                         f"'/proc/{holder.pid}/maps'"}  # fmt: skip
        else:  # gone: its descriptors are not read either, so its file counts as orphaned too
            assert unlinked == [f"{tmp_path}/verl_weights_held", f"{tmp_path}/verl_weights_orphan"]
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="the orphan scan reads every process: root only")
def test_nothing_is_unlinked_where_a_real_process_cannot_be_read(tmp_path):
    """Unpatched: where some live process cannot be read (this VM's init), the clean-up unlinks nothing."""
    if not _unreadable_now():
        pytest.skip("every process is readable here")
    (tmp_path / "verl_weights_x").write_bytes(b"")
    assert unlink_orphaned_shm(str(tmp_path)) == [] and (tmp_path / "verl_weights_x").exists()


@pytest.mark.parametrize(
    ("ns_inode", "proc_self", "why"),
    [
        (shm_mod.PID_NS_INIT_INO + 1, None, "a child PID namespace"),
        (shm_mod.PID_NS_INIT_INO, "1", "/proc belongs to another PID namespace"),
        (shm_mod.PID_NS_INIT_INO, None, None),
    ],
)
def test_a_child_pid_namespace_or_a_foreign_proc_is_a_blind_spot(tmp_path, monkeypatch, ns_inode, proc_self, why):
    real_stat, real_readlink = os.stat, os.readlink

    def stat(path, *args, **kwargs):
        st = real_stat(path, *args, **kwargs)
        if str(path) == "/proc/self/ns/pid":
            return os.stat_result((st.st_mode, ns_inode, *tuple(st)[2:]))
        return st

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "readlink", lambda p: proc_self if p == "/proc/self" and proc_self else real_readlink(p))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    got = shm_mod.blind_spot()
    assert (got is None) if why is None else got.startswith(why), got
    if why is not None:
        (tmp_path / "verl_weights_x").write_bytes(b"")
        assert unlink_orphaned_shm(str(tmp_path)) == [] and (tmp_path / "verl_weights_x").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the orphan scan reads every process: root only")
def test_the_harness_rule_unlinks_only_what_it_saw_held_whatever_it_cannot_see(tmp_path, monkeypatch, capsys):
    """``seen``: entries the caller saw its own processes hold, all dead now. That sighting is its proof, so a blind
    spot and an unreadable process (pid 1, patched) do not stop it, which stop the strict rule; but an entry it did
    not see (another name, or its name now on another inode) is kept, and so is one a live process still holds."""
    holder = _orphan_and_holder(tmp_path)  # verl_weights_orphan (no holder), verl_weights_held (held by a child)
    for name in ("sem.loky-1-seen", "sem.mp-2-replaced", "psm_unseen"):
        (tmp_path / name).write_bytes(b"")
    inode = {entry.name: entry.inode() for entry in os.scandir(tmp_path)}
    seen = {
        str(tmp_path / name): inode[name] for name in ("verl_weights_orphan", "verl_weights_held", "sem.loky-1-seen")
    }
    seen[str(tmp_path / "sem.mp-2-replaced")] = inode["sem.mp-2-replaced"] + 1  # the name now on another inode
    real = shm_mod._read_maps

    def read_maps(pid):
        if pid == "1":
            raise PermissionError(13, "simulated", "/proc/1/maps")
        return real(pid)

    monkeypatch.setattr(shm_mod, "_read_maps", read_maps)
    monkeypatch.setattr(shm_mod, "blind_spot", lambda: "a child PID namespace (simulated)")
    try:
        assert shm_mod.holders(str(tmp_path))[1].keys() >= {1}  # pid 1 unreadable here, whatever the machine
        assert unlink_orphaned_shm(str(tmp_path), ("",)) == []  # the strict rule: blind
        assert "a child PID namespace (simulated), so a live holder could be missed" in capsys.readouterr().err
        unlinked = unlink_orphaned_shm(str(tmp_path), ("",), seen=seen)
        assert unlinked == [f"{tmp_path}/sem.loky-1-seen", f"{tmp_path}/verl_weights_orphan"]
        assert sorted(os.listdir(tmp_path)) == ["psm_unseen", "sem.mp-2-replaced", "verl_weights_held"]
        assert capsys.readouterr().err == ""
    finally:
        holder.kill()
        holder.wait()
