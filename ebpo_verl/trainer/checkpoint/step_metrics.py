"""A step's training metrics saved with its checkpoint (``global_step_N/ebpo_step_metrics.json``): verl writes
its tracker file, then validates, then logs the step, so a run killed in between logs them on resume."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ebpo_verl.ops.atomic import atomic_write_text
from ebpo_verl.ops.errors import one_line, shorten
from ebpo_verl.options.parsing import is_int

STEP_METRICS_FILE = "ebpo_step_metrics.json"
FORMAT = 1


def save_step_metrics(step_dir: str | os.PathLike, metrics: dict[str, Any], global_step: int) -> Path:
    """Write step ``global_step``'s training metrics to ``step_dir/ebpo_step_metrics.json`` atomically, before
    verl's tracker file (:func:`load_step_metrics` logs them on resume). Numbers only (scalars as Python numbers; NaN
    kept); returns the path.
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
    checkpoint has none (written before this file existed). Anything but what it writes (a JSON object of exactly
    ``format`` 1, ``global_step`` an integer >= 0 and ``metrics`` an object of numbers) or a file of another step
    raises one ValueError line naming the file."""
    path = Path(step_dir) / STEP_METRICS_FILE
    if not path.is_file():
        return None
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(payload, dict) or set(payload) != {"format", "global_step", "metrics"}:
            raise ValueError("expected a JSON object of exactly format, global_step and metrics")
        if not is_int(payload["format"]) or payload["format"] != FORMAT:
            raise ValueError(f"format {shorten(payload['format'])} is not supported (expected {FORMAT})")
        saved_step, metrics = payload["global_step"], payload["metrics"]
        if not is_int(saved_step) or saved_step < 0:
            raise ValueError(f"global_step must be an integer >= 0, got {shorten(saved_step)}")
        if not isinstance(metrics, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in metrics.values()
        ):
            raise ValueError("metrics must be a JSON object of numbers")
    except (ValueError, OSError, RecursionError) as err:  # JSON's errors and a non-UTF-8 byte: ValueErrors
        why = "nested too deeply" if isinstance(err, RecursionError) else one_line(err)
        raise ValueError(f"step metrics file {path} is unreadable: {why}; delete it to resume without it") from err
    if saved_step != int(global_step):
        raise ValueError(f"step metrics file {path} was written at global step {saved_step}, not {global_step}")
    return metrics


def unlogged_step_metrics(saved: dict[str, Any], logged: dict[str, Any]) -> dict[str, Any]:
    """The saved metrics of a step whose keys its metrics-log record ``logged`` lacks."""
    return {k: v for k, v in saved.items() if k not in logged}
