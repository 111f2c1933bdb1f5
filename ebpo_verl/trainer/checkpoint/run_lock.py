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
    """Exclusive locks (:func:`ebpo_verl.ops.locking.exclusive_lock`) on ``trainer.default_local_dir``
    (``ebpo-train.lock``) and ``<trainer.metrics_log_path>.lock``, held until the returned stack closes; a second run
    gets :class:`~ebpo_verl.ops.locking.LockHeldError` at once, and the OS drops locks of a killed holder. A checkpoint
    folder (and parents) this call created is removed on release if left empty.
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
