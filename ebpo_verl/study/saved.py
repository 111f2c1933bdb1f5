"""The report of a study's saved runs without training (``python -m ebpo_verl.study report --study DIR --out DIR2``):
the preset DIR records, its warm start (loaded), its saved runs, and its wall time as its ``summary.json`` recorded
it or else from its files' times. Nothing is written into DIR."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebpo_verl.ops.errors import one_line, shorten
from ebpo_verl.options.parsing import is_int, is_real
from ebpo_verl.study.presets import ALL_ESTIMATORS, PRESETS, Preset
from ebpo_verl.study.report import study_provenance
from ebpo_verl.study.runner import (
    NotSavedYet,
    StudyDirError,
    code_fingerprint,
    grid,
    load_done,
    recorded_code,
    run_path,
)


def recorded_preset(study: Path) -> Preset:
    """The preset whose configuration ``study/study_config.json`` records (its estimators as recorded);
    StudyDirError when it is missing, unreadable, names no preset, records a ``code`` that is not an object of
    strings, or differs from that preset in this code."""
    path = study / "study_config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise StudyDirError(f"{path} not found: --study must be a study's --out folder") from None
    except (OSError, ValueError, RecursionError) as err:  # JSON's errors and a non-UTF-8 byte: ValueErrors
        why = "nested too deeply" if isinstance(err, RecursionError) else one_line(err)
        raise StudyDirError(f"{path} is unreadable ({why})") from err
    name = config.get("name") if isinstance(config, dict) else None
    if not isinstance(name, str) or name not in PRESETS:
        known = ", ".join(PRESETS)
        raise StudyDirError(f"{path} names preset {shorten(name)}, which this code does not have ({known})")
    estimators = config.get("estimators")
    if not (isinstance(estimators, list) and estimators and all(isinstance(e, str) and e in ALL_ESTIMATORS
            for e in estimators) and len(set(estimators)) == len(estimators)):  # fmt: skip
        raise StudyDirError(
            f"{path} records estimators {shorten(estimators)}, not a list of distinct estimators of the study "
            f"({', '.join(ALL_ESTIMATORS)})"
        )
    recorded_code(config, path)
    preset = PRESETS[name]
    if estimators != list(preset.estimators):
        preset = preset.with_estimators(tuple(estimators))
    want = preset.fingerprint()
    keys = sorted(k for k in {*config, *want} if k != "code" and config.get(k) != want.get(k))
    if keys:
        raise StudyDirError(
            f"{study} holds preset {name!r} with a configuration this code's preset does not have (differs in: "
            f"{', '.join(keys)}); report it with the code that ran it"
        )
    return preset


@dataclass
class Timing:
    """The study's wall time and command, and a sentence on where they come from."""

    seconds: float
    command: str
    resumed: int
    record: dict | None
    how: str


def study_timing(study: Path, preset: Preset, runs: list[dict], files: list[Path], prog: str) -> Timing:
    """The study's wall time: its ``summary.json``'s when that covers these runs, else from ``study_config.json`` to
    the last of ``files`` by mtime, with a provenance record started then."""
    try:
        saved = json.loads((study / "summary.json").read_text())
    except (OSError, ValueError, RecursionError):  # none, or unreadable: measured from the files below
        saved = None
    if _records(saved, preset, len(runs)):
        how = (
            f"the wall time is the one the study's invocation recorded ({study / 'summary.json'}; "
            f"{saved['resumed_runs']} runs reused from an earlier invocation)"
        )
        return Timing(saved["wall_seconds"], saved["command"], saved["resumed_runs"], saved["provenance"], how)
    start = (study / "study_config.json").stat().st_mtime
    end = max(p.stat().st_mtime for p in files)
    how = (
        f"the study has not recorded its wall time for these runs ({study / 'summary.json'} absent or for other "
        "runs), so it is measured from its files: from study_config.json (written when it started) to the last "
        "saved run, by modification time, which includes any pause between invocations"
    )
    command = f"{prog} --preset {preset.name} --out {study}"
    record = study_provenance(preset, time.time() - start, command)  # started: when study_config.json was written
    return Timing(end - start, command, 0, record, how)


def _records(summary: Any, preset: Preset, n_runs: int) -> bool:
    """Whether ``summary`` records the wall time of ``preset``'s ``n_runs`` runs (preset, count, wall time,
    command, reused runs, provenance)."""
    if not isinstance(summary, dict) or summary.get("preset") != preset.name or summary.get("n_runs") != n_runs:
        return False
    seconds, resumed = summary.get("wall_seconds"), summary.get("resumed_runs")
    sane = is_real(seconds) and seconds >= 0 and is_int(resumed) and 0 <= resumed <= n_runs
    return sane and isinstance(summary.get("command"), str) and isinstance(summary.get("provenance"), dict)


def _saved(study: Path, jobs: list) -> tuple[list[dict], list[Path]]:
    """The saved runs of ``jobs`` in job order, and their files."""
    done = load_done(study, jobs)
    return list(done.values()), [run_path(study, cfg) for cfg in done]


def report_from_saved(study: Path, out: Path, command: str, prog: str) -> int:
    """Write the report of the runs saved in ``study`` into ``out``; 2 with one error line when there are none."""
    import torch

    from ebpo_verl.study.runner import describe_base, lr_grid_of, prepare_base
    from ebpo_verl.study.writeup import write_report

    def refuse(problem: str) -> int:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        return 2

    if (plan_report := report_plan(study, out, command)) is not None:
        return refuse(plan_report) if plan_report else 0
    try:
        preset = recorded_preset(study)
    except StudyDirError as err:
        return refuse(str(err))
    if not (study / "base_model.pt").is_file():
        return refuse(f"{study} has no saved warm start (base_model.pt): the study has not started its runs")
    tuning, tuning_files = _saved(study, preset.tuning_runs())
    want = len(preset.tuning_runs())
    if len(tuning) < want:
        return refuse(f"{study}: {len(tuning)} of {want} tuning runs saved; no test run to report before they end")
    lr_grid = lr_grid_of(preset, tuning)
    lrs = {e: g["chosen"] for e, g in lr_grid.items()}
    runs, files = _saved(study, grid(preset, lrs))
    if not runs:
        return refuse(f"{study} holds no test run of preset {preset.name} yet: nothing to report")
    torch.set_num_threads(1)  # the warm start's evaluation as the study computed it
    info = describe_base(prepare_base(preset, study))
    timing = study_timing(study, preset, runs, files + tuning_files, prog)
    recorded = recorded_code(json.loads((study / "study_config.json").read_text()), study / "study_config.json")
    now = code_fingerprint()
    same = "the same code" if recorded == now else "other code (every number is the saved runs', made by the first)"
    origin = (
        f"\nThis report was written by `{command}` from the runs saved in `{study}`, without training: "
        f"{len(runs)} test runs and {len(tuning)} tuning runs; {timing.how}. The runs were made by ebpo-verl "
        f"{recorded.get('version')} with study sources {str(recorded.get('source_sha256'))[:12]}; the report by "
        f"{now['version']}, {now['source_sha256'][:12]}: {same}.\n"
    )
    headline = write_report(out, preset, info, runs, timing.seconds, timing.command, timing.resumed, lr_grid,
                            len(tuning), record=timing.record, origin=origin)  # fmt: skip
    print(f"Final held-out accuracy (rows = estimator, columns = G), warm start {info['heldout_accuracy']:.3f}:")
    print(headline)
    print(f"\n{len(runs)} runs of {len(grid(preset, lrs))}; report: {out / 'study.md'}")
    return 0


def report_plan(study: Path, out: Path, command: str) -> str | None:
    """The report of a plan study (rivals2's or issue 52's ``why``) saved in ``study``, by the plan's own code with
    nothing trained and nothing written into ``study``: its closing note is printed and "" returned, or the refusal;
    None when ``study`` records no plan (a preset study)."""
    from ebpo_verl.study import rivals2, why

    try:
        config = json.loads((study / "study_config.json").read_text())
    except (OSError, ValueError, RecursionError):
        return None  # a preset study's reader says what is wrong with it
    name = config.get("name") if isinstance(config, dict) else None
    runners = {**dict.fromkeys(rivals2.PLANS, rivals2.run_plan), **dict.fromkeys(why.PLANS, why.run_why)}
    if not isinstance(name, str) or name not in runners:
        return None
    plan = {**rivals2.PLANS, **why.PLANS}[name]
    if {k: v for k, v in config.items() if k != "code"} != plan.fingerprint():
        return (
            f"{study} holds plan {name!r} with a configuration this code's plan does not have; use the code that ran it"
        )
    try:
        print(runners[name](plan, out, command, study_dir=study))
    except NotSavedYet as err:
        return str(err)
    return ""
