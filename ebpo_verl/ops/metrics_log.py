"""An append-only metrics log that survives resumes (verl's ``file`` logger truncates its file on restart).

``MetricsLog`` is a backend of verl's ``Tracking``: one line ``{"step": <int>, "data": {...}}`` per ``log`` call;
:func:`read_metrics_log` merges a step's lines in file order. On start, lines after the resumed checkpoint move to
``<stem>.superseded-<UTC time>[-k].jsonl`` (nothing deleted). Provenance: ``<log>.provenance.json`` =
``{"attempts": [{"resumed_step": N, "provenance": {...}}, ...]}`` (:func:`read_provenance`).
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from collections.abc import Iterable
from contextlib import suppress
from itertools import count
from pathlib import Path
from typing import Any

from ebpo_verl.ops.atomic import atomic_write_text
from ebpo_verl.ops.errors import OneLineMessage, shorten

logger = logging.getLogger(__name__)


def _to_json(value: Any) -> Any:
    """numpy / torch scalars and arrays as plain Python (``item``/``tolist``); anything else as ``str``."""
    for attr in ("item", "tolist"):
        if hasattr(value, attr):
            with suppress(TypeError, ValueError, RuntimeError):
                return getattr(value, attr)()
    return str(value)


STEP_END = 2**63
"""Steps lie in [0, STEP_END): the range of a signed 64-bit counter, which numpy and matplotlib read exactly."""


def is_step(value: Any) -> bool:
    """A training step: an int (not a bool) in [0, :data:`STEP_END`)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < STEP_END


class MetricsLogError(OneLineMessage, ValueError):
    """A metrics log line that is not a ``{"step": int, "data": {...}}`` record (the message names file:line)."""


def _parse_lines(path: Path) -> list[tuple[int, dict[str, Any], str]]:
    """(step, data, raw line) of every record; a torn last line (a crash mid-write) is skipped with a warning."""
    records = []
    lines = path.read_bytes().splitlines()
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
            record = json.loads(line)
            step, data = record["step"], record["data"]
            if not is_step(step) or not isinstance(data, dict):
                raise TypeError(f"step must be an integer in [0, 2**63) and data an object, got {shorten(record)}")
        except (ValueError, KeyError, TypeError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
            why = "nested too deeply" if isinstance(err, RecursionError) else " ".join(str(err).split())[:300]
            if number == len(lines):
                warnings.warn(f"{path}:{number}: skipping a torn last line ({why})", stacklevel=3)
                continue
            raise MetricsLogError(f"{path}:{number}: not a {{'step', 'data'}} metrics record: {why}") from err
        records.append((step, data, line))
    return records


def read_records(path: str | os.PathLike) -> list[tuple[int, dict[str, Any]]]:
    """(step, data) of every line of one log file, in file order."""
    return [(step, data) for step, data, _ in _parse_lines(Path(path))]


def merge_attempts(records: Iterable[tuple[int, dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    """Step -> metrics, lines merged in order (later keys win). A line whose step is not after the previous
    line's starts a new attempt (a restart from a checkpoint), which supersedes the earlier attempt's steps after
    its first step; lines of the same step (e.g. a resumed run's validation before its first step) merge."""
    merged: dict[int, dict[str, Any]] = {}
    last = None
    for step, data in records:
        if last is not None and step <= last:
            for later in [s for s in merged if s > step]:
                del merged[later]
        merged.setdefault(step, {}).update(data)
        last = step
    return dict(sorted(merged.items()))


class MetricsLog:
    """A ``Tracking`` backend appending ``{"step", "data"}`` lines to ``path`` (opened per write, flushed)."""

    def __init__(self, path: str | os.PathLike, resumed_step: int, provenance: dict[str, Any] | None = None):
        """Open the log of a run that starts after ``resumed_step`` (0: a run from scratch); ``provenance`` (a
        :func:`ebpo_verl.ops.provenance.provenance` record; default: this process's, without a seed) is recorded in
        the sidecar as this attempt's."""
        from ebpo_verl.ops.provenance import provenance as this_process

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._reconcile(int(resumed_step))
        self._record_attempt(int(resumed_step), this_process() if provenance is None else provenance)

    def _record_attempt(self, resumed_step: int, provenance: dict[str, Any]) -> None:
        side = provenance_path(self.path)
        attempts = read_provenance(side) if resumed_step > 0 and side.is_file() else []
        attempts = [a for a in attempts if a["resumed_step"] < resumed_step]
        attempts.append({"resumed_step": resumed_step, "provenance": provenance})
        atomic_write_text(side, json.dumps({"attempts": attempts}, indent=1, default=_to_json) + "\n")

    def _reconcile(self, resumed_step: int) -> None:
        if not self.path.is_file():
            return
        keep, drop = [], []
        for step, _, line in _parse_lines(self.path):
            (keep if 0 < resumed_step and step <= resumed_step else drop).append(line)
        text = "".join(line + "\n" for line in keep)
        if drop:
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            names = (f"{self.path.stem}.superseded-{stamp}{f'-{k}' if k else ''}{self.path.suffix}" for k in count())
            aside = next(path for name in names if not (path := self.path.with_name(name)).exists())
            atomic_write_text(aside, "".join(line + "\n" for line in drop))
            logger.warning(
                "metrics log %s: moved %d line(s) of steps after %d (not part of this run's history) to %s",
                self.path,
                len(drop),
                resumed_step,
                aside,
            )
        if text.encode("utf-8") != self.path.read_bytes():  # lines moved aside, or a torn last line dropped
            atomic_write_text(self.path, text)

    def log(self, data: dict[str, Any], step: int) -> None:
        line = json.dumps({"step": int(step), "data": data}, default=_to_json, allow_nan=True) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:  # closing it flushes the line
            f.write(line)

    def finish(self) -> None:
        """Nothing to close: every line is written and flushed by ``log``."""


def read_metrics_log(path: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """Step -> metrics of a log written by :class:`MetricsLog` (or verl's file logger), as :func:`merge_attempts`.

    NaN is kept as ``float('nan')``. :class:`MetricsLogError` names the file and line of a broken record.
    """
    return merge_attempts(read_records(path))


def provenance_path(log: str | os.PathLike) -> Path:
    """The provenance sidecar of a metrics log: ``<log>.provenance.json``."""
    return Path(f"{log}.provenance.json")


def read_provenance(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The attempts (``{"resumed_step", "provenance"}``, oldest first) recorded for a metrics log; ``path`` is the
    log or its sidecar. [] when there is no sidecar; :class:`MetricsLogError` naming the file when it is malformed."""
    side = Path(path) if str(path).endswith(".provenance.json") else provenance_path(path)
    if not side.is_file():
        return []
    try:
        attempts = json.loads(side.read_text(encoding="utf-8"))["attempts"]
        if not isinstance(attempts, list) or not all(isinstance(a.get("provenance"), dict) for a in attempts):
            raise TypeError("attempts must be a list of {resumed_step, provenance}")
        for a in attempts:
            if not is_step(a["resumed_step"]):
                raise TypeError(f"resumed_step {shorten(a['resumed_step'])} is not an integer in [0, 2**63)")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        why = "nested too deeply" if isinstance(err, RecursionError) else " ".join(str(err).split())[:300]
        raise MetricsLogError(f"{side}: not a provenance sidecar of a metrics log ({why}); delete it") from err
    return attempts
