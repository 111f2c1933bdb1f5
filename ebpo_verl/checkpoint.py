"""The EB statistics inside verl's checkpoints: ``<default_local_dir>/global_step_N/ebpo_state.json``.

The file is written atomically (temp file in the same folder, fsync, ``os.replace``) before verl writes
``latest_checkpointed_iteration.txt``, so a checkpoint that verl would resume from always has it. Layout::

    {"format": 1, "global_step": N, "options": {<algorithm.ebpo at save time>}, "state": EBPOState.state_dict()}

With ``adv_estimator=spo`` the SPO tracker goes the same way to ``global_step_N/spo_state.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from ebpo_verl.baselines import SPOOptions, SPOState
from ebpo_verl.estimator import EBPOOptions, EBPOState

STATE_FILE = "ebpo_state.json"
SPO_STATE_FILE = "spo_state.json"
FORMAT = 1


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see either the old file or the complete new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_ebpo_state(step_dir: str | os.PathLike, state: EBPOState, options: EBPOOptions, global_step: int) -> Path:
    """Write ``state`` (after ``global_step`` steps) to ``step_dir/ebpo_state.json``; returns the path."""
    payload = {
        "format": FORMAT,
        "global_step": int(global_step),
        "options": dataclasses.asdict(options),
        "state": state.state_dict(),
    }
    path = Path(step_dir) / STATE_FILE
    atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return path


def load_ebpo_state(step_dir: str | os.PathLike, state: EBPOState, options: EBPOOptions, global_step: int) -> bool:
    """Restore ``state`` from ``step_dir/ebpo_state.json``; returns False (after a loud warning) when absent.

    Without the file (a checkpoint written by plain verl or by an older run) the statistics start fresh.
    A malformed file, or one written at another step, raises ValueError: resuming from it would be silently wrong.
    Options that differ from the saved ones are reported with a warning (changing them on resume is allowed).
    """
    path = Path(step_dir) / STATE_FILE
    state.reset()
    if not path.is_file():
        warnings.warn(
            f"EBPO: no {STATE_FILE} in checkpoint {step_dir}: the empirical-Bayes statistics start FRESH at step "
            f"{global_step}, so advantages will differ from an uninterrupted run (checkpoint written without "
            "ebpo-verl?)",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    try:
        payload: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        if payload.get("format") != FORMAT:
            raise ValueError(f"format {payload.get('format')!r} is not supported (expected {FORMAT})")
        saved_step = int(payload["global_step"])
        state.load_state_dict(payload["state"])
    except (ValueError, KeyError, TypeError) as err:
        state.reset()
        raise ValueError(
            f"EBPO state file {path} is unreadable: {err}. Delete it to resume with fresh statistics."
        ) from err
    if saved_step != int(global_step):
        state.reset()
        raise ValueError(f"EBPO state file {path} was written at global step {saved_step}, not {global_step}")
    current = dataclasses.asdict(options)
    changed = {k: (v, current.get(k)) for k, v in payload.get("options", {}).items() if current.get(k) != v}
    if changed:
        diff = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items()))
        warnings.warn(f"EBPO: algorithm.ebpo changed since the checkpoint ({diff})", RuntimeWarning, stacklevel=2)
    return True


def save_spo_state(step_dir: str | os.PathLike, state: SPOState, options: SPOOptions, global_step: int) -> Path:
    """Write the SPO tracker (after ``global_step`` steps) to ``step_dir/spo_state.json``, atomically.

    Layout: ``{"format": 1, "global_step": N, "options": {<algorithm.spo>}, "state": SPOState.state_dict()}``.
    """
    payload = {
        "format": FORMAT,
        "global_step": int(global_step),
        "options": dataclasses.asdict(options),
        "state": state.state_dict(),
    }
    path = Path(step_dir) / SPO_STATE_FILE
    atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return path


def load_spo_state(step_dir: str | os.PathLike, state: SPOState, options: SPOOptions, global_step: int) -> bool:
    """Restore the SPO tracker from ``step_dir/spo_state.json``; False (after a loud warning) when absent.

    As :func:`load_ebpo_state`: no file -> fresh tracker; a malformed file or one of another step raises
    ValueError; changed ``algorithm.spo`` options warn (a new ``prompt_key`` makes the saved keys meaningless).
    """
    path = Path(step_dir) / SPO_STATE_FILE
    state.reset()
    if not path.is_file():
        warnings.warn(
            f"SPO: no {SPO_STATE_FILE} in checkpoint {step_dir}: every prompt's tracker starts FRESH (baseline 0.5) "
            f"at step {global_step}, so advantages will differ from an uninterrupted run",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    try:
        payload: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        if payload.get("format") != FORMAT:
            raise ValueError(f"format {payload.get('format')!r} is not supported (expected {FORMAT})")
        saved_step = int(payload["global_step"])
        state.load_state_dict(payload["state"])
    except (ValueError, KeyError, TypeError) as err:
        state.reset()
        raise ValueError(
            f"SPO state file {path} is unreadable: {err}. Delete it to resume with a fresh tracker."
        ) from err
    if saved_step != int(global_step):
        state.reset()
        raise ValueError(f"SPO state file {path} was written at global step {saved_step}, not {global_step}")
    current = dataclasses.asdict(options)
    changed = {k: (v, current.get(k)) for k, v in payload.get("options", {}).items() if current.get(k) != v}
    if changed:
        diff = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items()))
        warnings.warn(f"SPO: algorithm.spo changed since the checkpoint ({diff})", RuntimeWarning, stacklevel=2)
    return True
