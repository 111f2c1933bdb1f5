"""One training process per checkpoint folder and metrics log (:func:`hold_run_outputs`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from ebpo_verl.ops.locking import exclusive_lock

RUN_LOCK_FILE = "ebpo-train.lock"


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first
        try:
            folder.rmdir()
        except OSError:  # not empty, or gone
            return


def hold_run_outputs(trainer: Any) -> contextlib.ExitStack:
    """Exclusive locks (:func:`ebpo_verl.ops.locking.exclusive_lock`) on a training run's outputs, held until the
    returned stack is closed (use it as a ``with`` block around the run): ``trainer.default_local_dir`` (lock
    file ``ebpo-train.lock`` in it) and the metrics log (``<trainer.metrics_log_path>.lock``). A second run on
    either gets :class:`~ebpo_verl.ops.locking.LockHeldError` naming the holder at once; the operating system drops
    the locks when the holder exits or is killed, so a crashed run never blocks the next one. A checkpoint folder
    (and its parents) this call created is removed again on release if the run left nothing in it.
    """
    stack = contextlib.ExitStack()
    try:
        folder = Path(os.path.abspath(os.path.expanduser(str(trainer.default_local_dir))))
        created = [d for d in (folder, *folder.parents) if not d.exists()]  # removed again if left empty
        stack.callback(_remove_empty, created)
        stack.enter_context(exclusive_lock(folder / RUN_LOCK_FILE, what=f"trainer.default_local_dir {folder}"))
        log = trainer.get("metrics_log_path", None)
        if log:
            log = os.path.abspath(os.path.expanduser(str(log)))
            stack.enter_context(exclusive_lock(f"{log}.lock", what=f"trainer.metrics_log_path {log}"))
    except BaseException:
        stack.close()
        raise
    return stack
