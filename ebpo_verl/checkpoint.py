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
import warnings
from pathlib import Path
from typing import Any

from ebpo_verl.atomic import atomic_write_text
from ebpo_verl.baselines import SPOOptions, SPOState
from ebpo_verl.estimator import RESUME_KEYS, EBPOOptions, EBPOState

STATE_FILE = "ebpo_state.json"
SPO_STATE_FILE = "spo_state.json"
FORMAT = 1


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
    A malformed file (bad JSON, a field of the wrong length or sign, a non-finite number), or one written at
    another step, raises ValueError naming the file: resuming from it would be silently wrong. Options that
    differ from the saved ones (:func:`changed_options`) follow ``options.on_resume_mismatch``: ``error`` raises
    ValueError listing each change and the three ways out, ``reset`` starts fresh statistics with a warning
    (returns False), ``keep`` continues with the saved statistics (with a warning).
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
        if not isinstance(payload, dict):
            raise ValueError(f"expected a JSON object, got {type(payload).__name__}")
        if payload.get("format") != FORMAT:
            raise ValueError(f"format {payload.get('format')!r} is not supported (expected {FORMAT})")
        saved_step = int(payload["global_step"])
        saved_options = payload.get("options", {})
        if not isinstance(saved_options, dict):
            raise ValueError(f"options must be a JSON object, got {saved_options!r}")
        state.load_state_dict(payload["state"])
    except (ValueError, KeyError, TypeError, OSError) as err:  # JSONDecodeError/UnicodeDecodeError are ValueErrors
        state.reset()
        raise ValueError(
            f"EBPO state file {path} is unreadable: {err}. Delete it to resume with fresh statistics."
        ) from err
    if saved_step != int(global_step):
        state.reset()
        raise ValueError(f"EBPO state file {path} was written at global step {saved_step}, not {global_step}")
    changed = changed_options(saved_options, options)
    if not changed:
        return True
    diff = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
    if options.on_resume_mismatch == "error":
        state.reset()
        restore = " ".join(f"algorithm.ebpo.{k}={_override(old)}" for k, (old, _) in changed.items())
        raise ValueError(
            f"algorithm.ebpo differs from the checkpoint's options in {path} ({diff}). Either resume with the "
            f"checkpoint's values ({restore}), or set algorithm.ebpo.on_resume_mismatch=reset to start fresh "
            "statistics under the new options, or algorithm.ebpo.on_resume_mismatch=keep to continue with the saved "
            "statistics under the new options."
        )
    if options.on_resume_mismatch == "reset":
        state.reset()
        warnings.warn(
            f"EBPO: algorithm.ebpo changed since the checkpoint ({diff}); on_resume_mismatch=reset: the "
            f"empirical-Bayes statistics start FRESH at step {global_step}",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    warnings.warn(
        f"EBPO: algorithm.ebpo changed since the checkpoint ({diff}); on_resume_mismatch=keep: continuing with the "
        "saved statistics",
        RuntimeWarning,
        stacklevel=2,
    )
    return True


def changed_options(saved: dict[str, Any], options: EBPOOptions) -> dict[str, tuple[Any, Any]]:
    """``key -> (saved, current)`` for each option that differs (``on_resume_mismatch`` itself never counts).

    A key absent from an older checkpoint counts as that option's default (what the older code did).
    """
    defaults, current = dataclasses.asdict(EBPOOptions()), dataclasses.asdict(options)
    unknown = sorted(set(saved) - set(current))
    changed = {k: (saved[k], None) for k in unknown}
    for key in RESUME_KEYS:
        old = saved.get(key, defaults[key])
        if old != current[key]:
            changed[key] = (old, current[key])
    return changed


def _override(value: Any) -> str:
    """A value as a Hydra command-line override (None -> null)."""
    return "null" if value is None else str(value)


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
    ValueError. Another ``prompt_key`` than the saved one raises too (the saved keys would silently name other
    prompts); other changed ``algorithm.spo`` options continue with the saved tracker, with a warning.
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
        if not isinstance(payload, dict) or not isinstance(payload.get("options", {}), dict):
            raise ValueError("expected a JSON object with an `options` object")
        if payload.get("format") != FORMAT:
            raise ValueError(f"format {payload.get('format')!r} is not supported (expected {FORMAT})")
        saved_step = int(payload["global_step"])
        state.load_state_dict(payload["state"])
    except (ValueError, KeyError, TypeError, OSError) as err:
        state.reset()
        raise ValueError(
            f"SPO state file {path} is unreadable: {err}. Delete it to resume with a fresh tracker."
        ) from err
    if saved_step != int(global_step):
        state.reset()
        raise ValueError(f"SPO state file {path} was written at global step {saved_step}, not {global_step}")
    current = dataclasses.asdict(options)
    changed = {k: (v, current.get(k)) for k, v in payload.get("options", {}).items() if current.get(k) != v}
    if "prompt_key" in changed:
        state.reset()
        old = changed["prompt_key"][0]
        raise ValueError(
            f"algorithm.spo.prompt_key={options.prompt_key!r} but the SPO tracker in {path} is keyed by {old!r}: "
            f"resume with algorithm.spo.prompt_key={old}, or delete {path} to start a fresh tracker"
        )
    if changed:
        diff = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items()))
        warnings.warn(f"SPO: algorithm.spo changed since the checkpoint ({diff})", RuntimeWarning, stacklevel=2)
    return True
