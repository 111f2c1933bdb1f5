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
        try:
            with open(f"/proc/{child.pid}/maps") as maps:
                paths |= {line.split(None, 5)[-1].strip() for line in maps if " /dev/shm/psm_" in line}
        except OSError:
            continue
    unlinked = []
    for path in sorted(p for p in paths if not p.endswith("(deleted)")):
        try:
            os.unlink(path)
            unlinked.append(path)
        except FileNotFoundError:
            pass
    return unlinked
