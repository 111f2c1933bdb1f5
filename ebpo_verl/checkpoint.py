"""The EB statistics inside verl's checkpoints: ``<default_local_dir>/global_step_N/ebpo_state.json``.

The file is written atomically (temp file in the same folder, fsync, ``os.replace``) before verl writes
``latest_checkpointed_iteration.txt``, so a checkpoint that verl would resume from always has it. Layout::

    {"format": 1, "global_step": N, "options": {<algorithm.ebpo at save time>}, "state": EBPOState.state_dict()}

With ``adv_estimator=spo`` the SPO tracker goes the same way to ``global_step_N/spo_state.json`` (options
``algorithm.spo``), and with ``adv_estimator=dbb`` the DBB posteriors to ``global_step_N/dbb_state.json``
(``algorithm.dbb``). All three files share one save/load path: the same validation, and the same
``on_resume_mismatch`` choice when the options differ, or when the file is missing (a plain verl checkpoint:
``error`` by default). :func:`check_resume` runs that check on the driver (the pre-flight), before Ray starts,
after :func:`tracked_step` has checked verl's tracker file; the TaskRunner's load repeats it as the backstop.

Also here: the step's training metrics saved with its checkpoint (:func:`save_step_metrics`, logged on resume if
the run died before verl's log call) and the one-writer lock on a run's outputs (:func:`hold_run_outputs`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebpo_verl.atomic import atomic_write_text
from ebpo_verl.baselines import SPO_RESUME_KEYS, SPOOptions, SPOState
from ebpo_verl.dbb import DBB_RESUME_KEYS, DBBOptions, DBBState
from ebpo_verl.estimator import RESUME_KEYS, EBPOOptions, EBPOState, ignored_keys

STATE_FILE = "ebpo_state.json"
SPO_STATE_FILE = "spo_state.json"
DBB_STATE_FILE = "dbb_state.json"
STEP_METRICS_FILE = "ebpo_step_metrics.json"
TRACKER_FILE = "latest_checkpointed_iteration.txt"
RUN_LOCK_FILE = "ebpo-train.lock"
FORMAT = 1
MODE_KEYS = ("stats_scope", "prior", "shrinkage", "norm", "cluster_key")
"""The ``algorithm.ebpo`` options that pick the mode whose ignored options (:func:`ignored_keys`) never block."""


@dataclass(frozen=True)
class _Kind:
    """What differs between the EBPO statistics and the SPO tracker on their way through a checkpoint."""

    file: str
    label: str  # "EBPO" / "SPO" / "DBB"
    section: str  # "algorithm.ebpo" / "algorithm.spo" / "algorithm.dbb"
    what: str  # what starts fresh
    changed: Callable[[dict[str, Any], Any], dict[str, tuple[Any, Any]]]


def _save(kind: _Kind, step_dir: str | os.PathLike, state: Any, options: Any, global_step: int) -> Path:
    payload = {
        "format": FORMAT,
        "global_step": int(global_step),
        "options": dataclasses.asdict(options),
        "state": state.state_dict(),
    }
    path = Path(step_dir) / kind.file
    atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return path


def _load(kind: _Kind, step_dir: str | os.PathLike, state: Any, options: Any, global_step: int) -> bool:
    path = Path(step_dir) / kind.file
    state.reset()
    if not path.is_file():
        if options.on_resume_mismatch == "error":
            raise ValueError(missing_state_message(kind, step_dir, global_step))
        warnings.warn(
            f"{kind.label}: no {kind.file} in checkpoint {step_dir}: on_resume_mismatch={options.on_resume_mismatch}: "
            f"the {kind.what} start FRESH at step {global_step}, so advantages will differ from an uninterrupted run",
            RuntimeWarning,
            stacklevel=3,
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
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as err:  # JSON errors are ValueErrors
        state.reset()
        raise ValueError(
            f"{kind.label} state file {path} is unreadable: {err}. Delete it to resume with fresh {kind.what}."
        ) from err
    if saved_step != int(global_step):
        state.reset()
        raise ValueError(f"{kind.label} state file {path} was written at global step {saved_step}, not {global_step}")
    changed = kind.changed(saved_options, options)
    if not changed:
        return True
    known = {k: v for k, v in changed.items() if v[1] is not _UNKNOWN}
    diff = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in known.items())
    unknown = {k: old for k, (old, new) in changed.items() if new is _UNKNOWN}
    if unknown:
        extra = ", ".join(f"{k}={v!r}" for k, v in unknown.items())
        diff = "; ".join(filter(None, [diff, f"option(s) unknown to this version of ebpo-verl: {extra}"]))
    mode = options.on_resume_mismatch
    if kind.label in ("SPO", "DBB") and "prompt_key" in known and mode == "keep":
        mode = "error"  # the saved keys would silently name other prompts
    if mode == "error":
        state.reset()
        restore = " ".join(f"{kind.section}.{k}={_override(old)}" for k, (old, _) in known.items())
        first = f"resume with the checkpoint's values ({restore}), or " if restore else ""
        keep = f", or {kind.section}.on_resume_mismatch=keep to continue with the saved {kind.what}"
        if "prompt_key" in known and kind.label in ("SPO", "DBB"):
            keep = ""
        raise ValueError(
            f"{kind.section} differs from the checkpoint's options in {path} ({diff}). Either {first}set "
            f"{kind.section}.on_resume_mismatch=reset to start fresh {kind.what} under the new options{keep}."
        )
    if mode == "reset":
        state.reset()
        warnings.warn(
            f"{kind.label}: {kind.section} changed since the checkpoint ({diff}); on_resume_mismatch=reset: the "
            f"{kind.what} start FRESH at step {global_step}",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    warnings.warn(
        f"{kind.label}: {kind.section} changed since the checkpoint ({diff}); on_resume_mismatch=keep: continuing "
        f"with the saved {kind.what}",
        RuntimeWarning,
        stacklevel=3,
    )
    return True


def missing_state_message(kind: _Kind, step_dir: str | os.PathLike, global_step: int) -> str:
    """The refusal of a checkpoint without the state file under ``on_resume_mismatch=error``."""
    return (
        f"checkpoint {step_dir} has no {kind.file} (written by plain verl, by a run with another estimator, or the "
        f"file was deleted), so the {kind.what} of the first {global_step} steps cannot be restored. Resume from "
        f"a checkpoint of this run, or set {kind.section}.on_resume_mismatch=reset to continue from step "
        f"{global_step} with fresh {kind.what} (advantages will differ from an uninterrupted run)."
    )


_UNKNOWN = object()
"""The "current value" of a saved option this version does not know."""


def _changes(
    saved: dict[str, Any], current: dict[str, Any], defaults: dict[str, Any], keys: tuple[str, ...]
) -> dict[str, tuple[Any, Any]]:
    changed: dict[str, tuple[Any, Any]] = {k: (saved[k], _UNKNOWN) for k in sorted(set(saved) - set(current))}
    for key in keys:
        old = saved.get(key, defaults[key])  # absent from an older checkpoint: that option's default
        if old != current[key]:
            changed[key] = (old, current[key])
    return changed


def changed_options(saved: dict[str, Any], options: EBPOOptions) -> dict[str, tuple[Any, Any]]:
    """``key -> (saved, current)`` for each ``algorithm.ebpo`` option that differs; a saved key this version does
    not know maps to ``(saved, _UNKNOWN)``. Never counted: ``on_resume_mismatch`` itself, and, when the mode
    (:data:`MODE_KEYS`) is unchanged, the options that mode ignores (e.g. decay/merge with ``stats_scope=batch``,
    whose saved statistics are empty)."""
    defaults, current = dataclasses.asdict(EBPOOptions()), dataclasses.asdict(options)
    changed = _changes(saved, current, defaults, RESUME_KEYS)
    if not any(k in changed for k in MODE_KEYS):
        for key in ignored_keys(options):
            changed.pop(key, None)
    return changed


def spo_changed_options(saved: dict[str, Any], options: SPOOptions) -> dict[str, tuple[Any, Any]]:
    """As :func:`changed_options` for ``algorithm.spo``."""
    return _changes(saved, dataclasses.asdict(options), dataclasses.asdict(SPOOptions()), SPO_RESUME_KEYS)


def dbb_changed_options(saved: dict[str, Any], options: DBBOptions) -> dict[str, tuple[Any, Any]]:
    """As :func:`changed_options` for ``algorithm.dbb``."""
    return _changes(saved, dataclasses.asdict(options), dataclasses.asdict(DBBOptions()), DBB_RESUME_KEYS)


def _override(value: Any) -> str:
    """A value as a Hydra command-line override (None -> null)."""
    return "null" if value is None else str(value)


EBPO = _Kind(STATE_FILE, "EBPO", "algorithm.ebpo", "empirical-Bayes statistics", changed_options)
SPO = _Kind(SPO_STATE_FILE, "SPO", "algorithm.spo", "SPO trackers (baseline 0.5)", spo_changed_options)
DBB = _Kind(DBB_STATE_FILE, "DBB", "algorithm.dbb", "DBB posteriors", dbb_changed_options)


def save_ebpo_state(step_dir: str | os.PathLike, state: EBPOState, options: EBPOOptions, global_step: int) -> Path:
    """Write ``state`` (after ``global_step`` steps) to ``step_dir/ebpo_state.json``, atomically; returns the path."""
    return _save(EBPO, step_dir, state, options, global_step)


def load_ebpo_state(step_dir: str | os.PathLike, state: EBPOState, options: EBPOOptions, global_step: int) -> bool:
    """Restore ``state`` from ``step_dir/ebpo_state.json``; returns False when it starts fresh instead.

    Without the file (a checkpoint written by plain verl or by an older run) the statistics start fresh, with a
    loud warning. A malformed file (bad JSON, a field of the wrong length or sign, a non-finite number), or one
    written at another step, raises ValueError naming the file: resuming from it would be silently wrong. Options
    that differ from the saved ones (:func:`changed_options`) follow ``options.on_resume_mismatch``: ``error``
    raises ValueError listing each change and the three ways out, ``reset`` starts fresh statistics with a
    warning (returns False), ``keep`` continues with the saved statistics (with a warning).
    """
    return _load(EBPO, step_dir, state, options, global_step)


def save_spo_state(step_dir: str | os.PathLike, state: SPOState, options: SPOOptions, global_step: int) -> Path:
    """Write the SPO tracker (after ``global_step`` steps) to ``step_dir/spo_state.json``, atomically."""
    return _save(SPO, step_dir, state, options, global_step)


def load_spo_state(step_dir: str | os.PathLike, state: SPOState, options: SPOOptions, global_step: int) -> bool:
    """Restore the SPO tracker from ``step_dir/spo_state.json``: as :func:`load_ebpo_state`, with
    ``algorithm.spo.on_resume_mismatch``; a changed ``prompt_key`` never continues under ``keep`` (the saved keys
    would silently name other prompts): it raises unless ``reset``."""
    return _load(SPO, step_dir, state, options, global_step)


def save_dbb_state(step_dir: str | os.PathLike, state: DBBState, options: DBBOptions, global_step: int) -> Path:
    """Write the DBB posteriors (after ``global_step`` steps) to ``step_dir/dbb_state.json``, atomically."""
    return _save(DBB, step_dir, state, options, global_step)


def load_dbb_state(step_dir: str | os.PathLike, state: DBBState, options: DBBOptions, global_step: int) -> bool:
    """Restore the DBB posteriors from ``step_dir/dbb_state.json``: as :func:`load_spo_state`, with
    ``algorithm.dbb.on_resume_mismatch``."""
    return _load(DBB, step_dir, state, options, global_step)


def tracked_step(base: str | os.PathLike) -> int | None:
    """The step ``base/latest_checkpointed_iteration.txt`` names (None without the file), checked as verl will use
    it: a positive integer whose ``global_step_N`` folder exists. Anything else raises ValueError naming the file
    and the ways out (verl would fail on ``int('')`` after Ray starts, or silently train from scratch)."""
    tracker = Path(base, TRACKER_FILE)
    try:
        text = tracker.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(
            f"checkpoint tracker {tracker} is unreadable ({err}); delete it to start from scratch"
        ) from err
    steps = (p.name.removeprefix("global_step_") for p in Path(base).glob("global_step_*") if p.is_dir())
    found = sorted(int(n) for n in steps if n.isdigit())
    have = f"checkpoints here: {', '.join(f'global_step_{n}' for n in found)}" if found else "no global_step_* here"
    value = text.strip()
    if not value.isdigit() or int(value) < 1:
        what = "is empty" if not value else f"holds {value[:40]!r}, not a step number"
        raise ValueError(
            f"checkpoint tracker {tracker} {what} (a crash while verl wrote it?); {have}. Write the step of the last "
            "complete checkpoint into it, or delete it to start from scratch."
        )
    step = int(value)
    if not Path(base, f"global_step_{step}").is_dir():
        raise ValueError(
            f"checkpoint tracker {tracker} names step {step} but {Path(base, f'global_step_{step}')} does not exist "
            f"(verl would silently train from scratch); {have}. Write the step of an existing checkpoint into it, "
            "or delete it to start from scratch."
        )
    return step


def resume_step_folder(trainer: Any) -> tuple[str, int] | None:
    """(checkpoint folder, global step) that verl's v1 trainer will resume from, as its ``_load_checkpoint`` finds
    it (``trainer.resume_mode`` auto: ``default_local_dir/latest_checkpointed_iteration.txt``, checked by
    :func:`tracked_step`; ``resume_path``: ``trainer.resume_from_path``); None for a fresh start or a folder
    this machine cannot see."""
    mode = str(trainer.get("resume_mode", "auto"))
    if mode == "resume_path":
        folder = os.path.abspath(str(trainer.get("resume_from_path")))
    elif mode == "auto" and trainer.get("default_local_dir"):
        base = os.path.abspath(str(trainer.default_local_dir))
        step = tracked_step(base)
        if step is None:
            return None
        folder = os.path.join(base, f"global_step_{step}")
    else:
        return None
    try:
        return folder, int(folder.rstrip("/").split("global_step_")[-1])
    except ValueError:
        return None


def check_resume(
    trainer: Any, ebpo: EBPOOptions | None, spo: SPOOptions | None, dbb: DBBOptions | None = None
) -> str | None:
    """The pre-flight's resume check: the tracker file (:func:`tracked_step`), then the saved state of the step
    the run will resume from, loaded into a scratch state under ``on_resume_mismatch`` (``error`` / an unreadable
    or missing state file -> ValueError, before any worker starts). Warnings are left to the TaskRunner's load.
    Returns a line for the log (naming a state file that is missing and what happens instead), or None on a
    fresh start."""
    found = resume_step_folder(trainer)
    if found is None or not os.path.isdir(found[0]):
        return None
    folder, step = found
    notes = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for kind, options, state, load in (
            (EBPO, ebpo, EBPOState, load_ebpo_state),
            (SPO, spo, SPOState, load_spo_state),
            (DBB, dbb, DBBState, load_dbb_state),
        ):
            if options is None:
                continue
            if not Path(folder, kind.file).is_file() and options.on_resume_mismatch != "error":
                notes.append(
                    f"no {kind.file}: fresh {kind.what} from step {step}, "
                    f"{kind.section}.on_resume_mismatch={options.on_resume_mismatch}"
                )
            load(folder, state(), options, step)
    return f"resumes from {folder}" + (f" ({'; '.join(notes)})" if notes else "")


def save_step_metrics(step_dir: str | os.PathLike, metrics: dict[str, Any], global_step: int) -> Path:
    """Write step ``global_step``'s training metrics to ``step_dir/ebpo_step_metrics.json``, atomically.

    verl writes ``latest_checkpointed_iteration.txt``, then validates, then logs the step: a crash in between
    would lose the step's training metrics for good. The trainer saves them here before verl's tracker file, and
    a resume from this checkpoint logs them when the metrics log lacks them (:func:`load_step_metrics`).
    Numbers only (numpy/torch scalars as Python numbers; NaN kept); returns the path.
    """
    plain: dict[str, float | int] = {}
    for key, value in metrics.items():
        value = value.item() if hasattr(value, "item") else value
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, int | float):
            plain[str(key)] = value
    payload = {"format": FORMAT, "global_step": int(global_step), "metrics": plain}
    path = Path(step_dir) / STEP_METRICS_FILE
    atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=True, allow_nan=True) + "\n")
    return path


def load_step_metrics(step_dir: str | os.PathLike, global_step: int) -> dict[str, float | int] | None:
    """The training metrics :func:`save_step_metrics` saved in ``step_dir`` for ``global_step``; None when the
    checkpoint has none (written before this file existed). A malformed file or one of another step raises
    ValueError naming it."""
    path = Path(step_dir) / STEP_METRICS_FILE
    if not path.is_file():
        return None
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        if payload["format"] != FORMAT:
            raise ValueError(f"format {payload['format']!r} is not supported (expected {FORMAT})")
        saved_step, metrics = int(payload["global_step"]), payload["metrics"]
        if not isinstance(metrics, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in metrics.values()
        ):
            raise ValueError("metrics must be a JSON object of numbers")
    except (ValueError, KeyError, TypeError, OSError) as err:
        raise ValueError(f"step metrics file {path} is unreadable: {err}; delete it to resume without it") from err
    if saved_step != int(global_step):
        raise ValueError(f"step metrics file {path} was written at global step {saved_step}, not {global_step}")
    return metrics


def unlogged_step_metrics(saved: dict[str, Any], logged: dict[str, Any]) -> dict[str, Any]:
    """The saved metrics of a step whose keys its metrics-log record ``logged`` lacks."""
    return {k: v for k, v in saved.items() if k not in logged}


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first
        try:
            folder.rmdir()
        except OSError:  # not empty, or gone
            return


def hold_run_outputs(trainer: Any) -> contextlib.ExitStack:
    """Exclusive locks (:func:`ebpo_verl.locking.exclusive_lock`) on a training run's outputs, held until the
    returned stack is closed (use it as a ``with`` block around the run): ``trainer.default_local_dir`` (lock
    file ``ebpo-train.lock`` in it) and the metrics log (``<trainer.metrics_log_path>.lock``). A second run on
    either gets :class:`~ebpo_verl.locking.LockHeldError` naming the holder at once; the operating system drops
    the locks when the holder exits or is killed, so a crashed run never blocks the next one. A checkpoint folder
    (and its parents) this call created is removed again on release if the run left nothing in it.
    """
    from ebpo_verl.locking import exclusive_lock

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
