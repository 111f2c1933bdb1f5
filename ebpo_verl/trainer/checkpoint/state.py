"""An estimator's running state inside verl's checkpoints: ``<default_local_dir>/global_step_N/<state_file>``.

Written atomically (:mod:`ebpo_verl.ops.atomic`) before verl's ``latest_checkpointed_iteration.txt``. Layout::

    {"format": 1, "global_step": N, "options": {<algorithm.<name> at save time>}, "state": <state.state_dict()>}

Every stateful estimator (:func:`ebpo_verl.algos.registry.stateful`; file from its ``StateSpec``) shares the
validation and the ``on_resume_mismatch`` choice (:func:`_on_mismatch`) for differing options or a missing file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

from ebpo_verl.algos.estimator import FreshState
from ebpo_verl.algos.registry import EstimatorSpec
from ebpo_verl.ops.atomic import atomic_write_text
from ebpo_verl.ops.errors import one_line, shorten
from ebpo_verl.options.parsing import accepts

FORMAT = 1


def save_state(entry: EstimatorSpec, step_dir: str | os.PathLike, state: Any, options: Any, global_step: int) -> Path:
    """Write ``state`` (after ``global_step`` steps) and ``options`` to ``step_dir/<entry.state.file>``, atomically;
    returns the path."""
    payload = {
        "format": FORMAT,
        "global_step": int(global_step),
        "options": dataclasses.asdict(options),
        "state": state.state_dict(),
    }
    path = Path(step_dir) / entry.state.file
    atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return path


def load_state(entry: EstimatorSpec, step_dir: str | os.PathLike, state: Any, options: Any, global_step: int) -> bool:
    """Restore ``state`` from ``step_dir/<entry.state.file>``; False when it starts fresh instead. Without the file
    (plain verl's or an older run's checkpoint) ``on_resume_mismatch=error`` raises, the others warn loudly; a
    malformed file or one of another step raises ValueError naming it (:func:`_read_state_file`: resuming from it
    would be silently wrong); changed options (:func:`changed_options`) follow :func:`_on_mismatch`."""
    path = Path(step_dir) / entry.state.file
    state.reset()
    if not path.is_file():
        if options.on_resume_mismatch == "error":
            raise ValueError(
                f"checkpoint {step_dir} has no {entry.state.file} (written by plain verl, by a run with another "
                f"estimator, or the file was deleted), so the {entry.state.what} of the first {global_step} steps "
                f"cannot be restored. Resume from a checkpoint of this run, or set {entry.section}.on_resume_mismatch"
                f"=reset to continue from step {global_step} with fresh {entry.state.what} (advantages will differ "
                "from an uninterrupted run)."
            )
        warnings.warn(
            f"{entry.state.label}: no {entry.state.file} in checkpoint {step_dir}: on_resume_mismatch="
            f"{options.on_resume_mismatch}: the {entry.state.what} start FRESH at step {global_step}, so advantages "
            "will differ from an uninterrupted run",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    saved_options = _read_state_file(entry, path, state, global_step)
    changed = changed_options(entry, saved_options, options)
    return True if not changed else _on_mismatch(entry, path, state, options, changed, global_step)


def _read_state_file(entry: EstimatorSpec, path: Path, state: Any, global_step: int) -> dict[str, Any]:
    """Load the saved state of ``path`` into ``state``; returns the saved options. Any problem (bad JSON, a field of
    the wrong length or sign, a non-finite number) leaves it reset: ValueError naming the file."""
    try:
        payload: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(payload, dict):
            raise ValueError(f"expected a JSON object, got {type(payload).__name__}")
        if payload.get("format") != FORMAT:
            raise ValueError(f"format {payload.get('format')!r} is not supported (expected {FORMAT})")
        saved_step = payload["global_step"]
        if isinstance(saved_step, bool) or not isinstance(saved_step, int) or saved_step < 0:
            raise ValueError(f"global_step must be an integer >= 0, got {shorten(saved_step)}")
        saved_options = payload.get("options", {})
        _check_saved_options(entry, saved_options)
        if isinstance(state, FreshState):  # the package's states also check bounds set by the options
            state.load_state_dict(payload["state"], {**dataclasses.asdict(entry.options_cls()), **saved_options})
        else:
            state.load_state_dict(payload["state"])
    except (ValueError, KeyError, TypeError, AttributeError, OSError, RecursionError) as err:  # JSON's: ValueErrors
        state.reset()
        why = "nested too deeply" if isinstance(err, RecursionError) else one_line(err)
        raise ValueError(
            f"{entry.state.label} state file {path} is unreadable: {why}. Delete it to resume with fresh "
            f"{entry.state.what}."
        ) from err
    if saved_step != int(global_step):
        state.reset()
        raise ValueError(
            f"{entry.state.label} state file {path} was written at global step {saved_step}, not {global_step}"
        )
    return saved_options


def _check_saved_options(entry: EstimatorSpec, saved: Any) -> None:
    """ValueError unless ``saved`` maps option names (identifiers) to values: for an option of this version, one it
    accepts; for another (a newer version's), a JSON scalar."""
    if not isinstance(saved, dict):
        raise ValueError(f"options must be a JSON object, got {shorten(saved)}")
    declared = {f.name: f for f in entry.options_cls.declarations()}
    for key, value in saved.items():
        known = key in declared and accepts(declared[key], value)
        if not key.isidentifier() or not known and (key in declared or not isinstance(value, _SCALARS)):
            raise ValueError(f"options.{shorten(key)} = {shorten(value)} is not a value of {entry.section}.{key:.40}")


_SCALARS = (str, int, float, bool, type(None))


def _on_mismatch(
    entry: EstimatorSpec,
    path: Path,
    state: Any,
    options: Any,
    changed: dict[str, tuple[Any, Any]],
    global_step: int,
) -> bool:
    """The one resume-mismatch policy of every estimator: ``error`` raises ValueError listing each change and the
    ways out, ``reset`` starts fresh with a warning (False), ``keep`` continues with the saved state with a warning
    (True; never for a change of an option in ``entry.state.never_keep``, which raises unless ``reset``)."""
    known = {k: v for k, v in changed.items() if v[1] is not _UNKNOWN}
    diff = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in known.items())
    unknown = {k: old for k, (old, new) in changed.items() if new is _UNKNOWN}
    if unknown:
        extra = ", ".join(f"{k}={v!r}" for k, v in unknown.items())
        diff = "; ".join(filter(None, [diff, f"option(s) unknown to this version of ebpo-verl: {extra}"]))
    mode = options.on_resume_mismatch
    never_keep = any(k in known for k in entry.state.never_keep)
    if never_keep and mode == "keep":
        mode = "error"  # e.g. a changed prompt key: the saved keys would silently name other prompts
    section, what = entry.section, entry.state.what
    if mode == "error":
        state.reset()
        restore = " ".join(f"{section}.{k}={_override(old)}" for k, (old, _) in known.items())
        first = f"resume with the checkpoint's values ({restore}), or " if restore else ""
        keep = "" if never_keep else f", or {section}.on_resume_mismatch=keep to continue with the saved {what}"
        raise ValueError(
            f"{section} differs from the checkpoint's options in {path} ({diff}). Either {first}set "
            f"{section}.on_resume_mismatch=reset to start fresh {what} under the new options{keep}."
        )
    outcome = f"continuing with the saved {what}"
    if mode == "reset":
        state.reset()
        outcome = f"the {what} start FRESH at step {global_step}"
    warnings.warn(
        f"{entry.state.label}: {section} changed since the checkpoint ({diff}); on_resume_mismatch={mode}: {outcome}",
        RuntimeWarning,
        stacklevel=3,
    )
    return mode == "keep"


_UNKNOWN = object()
"""The "current value" of a saved option this version does not know."""


def changed_options(entry: EstimatorSpec, saved: dict[str, Any], options: Any) -> dict[str, tuple[Any, Any]]:
    """``key -> (saved, current)`` for each option that differs (a saved option absent from an older checkpoint:
    that option's default); a saved key this version does not know maps to ``(saved, _UNKNOWN)``. Never counted:
    ``on_resume_mismatch`` itself, and, when no mode key (``entry.state.mode_keys``) changed, the options that mode
    ignores (``entry.ignored``: e.g. decay/merge with ``stats_scope=batch``, whose saved statistics are empty)."""
    defaults, current = dataclasses.asdict(entry.options_cls()), dataclasses.asdict(options)
    changed: dict[str, tuple[Any, Any]] = {k: (saved[k], _UNKNOWN) for k in sorted(set(saved) - set(current))}
    for key in entry.resume_keys:
        old = saved.get(key, defaults[key])
        if old != current[key]:
            changed[key] = (old, current[key])
    if not any(k in changed for k in entry.state.mode_keys):
        for key in entry.state.ignored(options):
            changed.pop(key, None)
    return changed


def _override(value: Any) -> str:
    """A value as a Hydra command-line override (None -> null)."""
    if value is None:
        return "null"
    if isinstance(value, str) and not re.fullmatch(r"[\w.:/+-]+", value):
        return json.dumps(value)  # quoted, escapes on one line
    return str(value)
