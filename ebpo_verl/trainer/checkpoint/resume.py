"""Which checkpoint folder is which: where the trainer saves a step (:func:`step_folder`), which folder a run
resumes from (:func:`resume_folder`, with verl's tracker file checked by :func:`tracked_step`), and the
pre-flight's resume check (:func:`check_resume`), all worked out as verl's v1 trainer does."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from ebpo_verl.ops.errors import OneLineMessage
from ebpo_verl.trainer.checkpoint.state import load_state
from ebpo_verl.trainer.run_options import RunOptions

TRACKER_FILE = "latest_checkpointed_iteration.txt"


def step_folder(trainer: Any, global_step: int) -> str:
    """``<trainer.default_local_dir>/global_step_N`` as an absolute path: where step N is saved."""
    base = os.path.abspath(os.path.expanduser(str(trainer.default_local_dir)))
    return os.path.join(base, f"global_step_{int(global_step)}")


def loaded_folder(trainer: Any, global_step: int) -> str:
    """The ``global_step_N`` folder verl resumed from at ``global_step`` (``trainer.resume_mode`` auto:
    :func:`step_folder`; ``resume_path``: ``trainer.resume_from_path``), as an absolute path."""
    if str(trainer.get("resume_mode", "auto")) == "resume_path":
        return os.path.abspath(os.path.expanduser(str(trainer.resume_from_path)))
    return step_folder(trainer, global_step)


class TrackerError(OneLineMessage, ValueError):
    """verl's checkpoint tracker file names no checkpoint it can resume from (one line: the file and the ways out)."""


def tracked_step(base: str | os.PathLike) -> int | None:
    """The step ``base/latest_checkpointed_iteration.txt`` names (None without the file), checked as verl will use
    it: a positive integer whose ``global_step_N`` folder exists. Anything else raises :class:`TrackerError` naming
    the file and the ways out (verl would fail on ``int('')`` after Ray starts, or silently train from scratch)."""
    tracker = Path(base, TRACKER_FILE)
    try:
        text = tracker.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise TrackerError(
            f"checkpoint tracker {tracker} is unreadable ({err}); delete it to start from scratch"
        ) from err
    steps = (p.name.removeprefix("global_step_") for p in Path(base).glob("global_step_*") if p.is_dir())
    found = sorted(int(n) for n in steps if _step_number(n))
    have = f"checkpoints here: {', '.join(f'global_step_{n}' for n in found)}" if found else "no global_step_* here"
    value = text.strip()
    if not _step_number(value) or int(value) < 1:
        what = "is empty" if not value else f"holds {value[:40]!r}, not a step number"
        raise TrackerError(
            f"checkpoint tracker {tracker} {what} (a crash while verl wrote it?); {have}. Write the step of the last "
            "complete checkpoint into it, or delete it to start from scratch."
        )
    step = int(value)
    if not Path(base, f"global_step_{step}").is_dir():
        raise TrackerError(
            f"checkpoint tracker {tracker} names step {step} but its folder global_step_{step} does not exist "
            f"(verl would silently train from scratch); {have}. Write the step of an existing checkpoint into it, "
            "or delete it to start from scratch."
        )
    return step


def _step_number(text: str) -> bool:
    """Whether ``text`` is a step number as verl writes it: ASCII digits (``"²".isdigit()`` is true, ``int("²")``
    fails), at most 18 of them (Python's int() refuses over 4300)."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def resume_folder(trainer: Any) -> tuple[str, int] | None:
    """(checkpoint folder, global step) that verl's v1 trainer will resume from, as its ``_load_checkpoint`` finds
    it (``trainer.resume_mode`` auto: the step of ``default_local_dir/latest_checkpointed_iteration.txt``, checked
    by :func:`tracked_step`; ``resume_path``: ``trainer.resume_from_path``); None for a fresh start or a folder
    this machine cannot see."""
    mode = str(trainer.get("resume_mode", "auto"))
    if mode == "resume_path":
        folder = loaded_folder(trainer, 0)
    elif mode == "auto" and trainer.get("default_local_dir"):
        step = tracked_step(os.path.abspath(os.path.expanduser(str(trainer.default_local_dir))))
        if step is None:
            return None
        folder = step_folder(trainer, step)
    else:
        return None
    try:
        return folder, int(folder.rstrip("/").split("global_step_")[-1])
    except ValueError:
        return None


def check_resume(trainer: Any, options: RunOptions) -> str | None:
    """The pre-flight's resume check: the tracker file (:func:`tracked_step`), then the saved state of the step
    the run will resume from, loaded into a scratch state under ``on_resume_mismatch`` (``error`` / an unreadable
    or missing state file -> ValueError, before any worker starts). Warnings are left to the TaskRunner's load.
    Returns a line for the log (naming a state file that is missing and what happens instead), or None on a
    fresh start."""
    found = resume_folder(trainer)
    if found is None or not os.path.isdir(found[0]):
        return None
    folder, step = found
    notes = []
    entry, estimator = options.stateful, options.estimator
    if entry is not None:
        if not Path(folder, entry.state.file).is_file() and estimator.on_resume_mismatch != "error":
            notes.append(
                f"no {entry.state.file}: fresh {entry.state.what} from step {step}, "
                f"{entry.section}.on_resume_mismatch={estimator.on_resume_mismatch}"
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            load_state(entry, folder, entry.state_cls(), estimator, step)
    return f"resumes from {folder}" + (f" ({'; '.join(notes)})" if notes else "")
