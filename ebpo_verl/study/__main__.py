"""``python -m ebpo_verl.study [--preset tiny|quick|full] [--out DIR]`` and ``python -m ebpo_verl.study mse``.

Every finished RL run is saved under DIR/runs/ at once, so rerunning the same command after an interruption
resumes: saved runs (and the saved warm start) are reused, the rest run, and the report is written over all
of them. A different preset or configuration in the same DIR is refused.

``python -m ebpo_verl.study report --study DIR --out DIR2`` writes the report of the runs saved in DIR into DIR2
without training and without writing into DIR: the preset is the one DIR records, and it works while the study
runs (a partial report) and after the study's code has changed (the report names both versions)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from ebpo_verl.ops.atomic import DiskFullError, unwritable_reason
from ebpo_verl.options.cli import parse
from ebpo_verl.options.parsing import OptionSection, ints, option, text
from ebpo_verl.study import rivals2, why
from ebpo_verl.study.presets import ALL_ESTIMATORS, DEFAULT_LR, PRESETS, describe_presets
from ebpo_verl.study.rivals2 import RegimeError

PROG = "python -m ebpo_verl.study"
PLANS = {**rivals2.PLANS, **why.PLANS}
"""The plan studies (rivals2's and issue 52's ``why``), each with its runner and its wall time."""
RUN_PLAN = {**dict.fromkeys(rivals2.PLANS, rivals2.run_plan), **dict.fromkeys(why.PLANS, why.run_why)}
DURATION = {**rivals2.DURATION, **why.DURATION}


def main(argv: list[str] | None = None) -> int:
    """The command line; a full disk is one error line naming the file and the free space (exit status 2)."""
    try:
        return _main(argv)
    except DiskFullError as err:
        print(f"{PROG}: error: {err} (finished runs are kept; the rerun resumes)", file=sys.stderr)
        return 2


@dataclass(frozen=True)
class StudyOptions(OptionSection):
    """The study's command line, declared once: what it does and its options."""

    SECTION: ClassVar[str] = "study"

    preset: str = option("quick", "the study grid", choices=(*PRESETS, *PLANS))
    out: str = option("results", "output directory", rule=text("a folder"))
    workers: int | None = option(None, "processes for the RL runs; null: the preset's", choices=(None,), rule=ints(1))
    estimators: str | None = option(
        None,
        "comma-separated estimators to run instead of the preset's (any name of the estimator registry or a study "
        f"variant: {', '.join(ALL_ESTIMATORS)}); one without a preset rate trains at lr {DEFAULT_LR:g}; null: the "
        "preset's",
        choices=(None,),
        rule=text("comma-separated estimator names"),
    )
    study: str | None = option(
        None,
        "report: the study folder whose saved runs it reads (nothing is written there; its recorded preset is "
        "used); null: --out",
        choices=(None,),
        rule=text("a folder"),
    )
    what: str = option(  # the positional word (shown after the flags, as argparse lists it)
        "rl",
        "the RL study, the MSE check, or the report of a study's saved runs (no training)",
        choices=("rl", "mse", "report"),
        flag="what",
    )

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    @property
    def estimator_names(self) -> tuple[str, ...]:
        """The names of ``--estimators`` (empty: the preset's)."""
        return tuple(e.strip() for e in (self.estimators or "").split(",") if e.strip())


def _options(argv: list[str] | None) -> StudyOptions:
    epilog = "presets (wall time on 2 idle cores):\n" + describe_presets()
    epilog += "".join(
        f"\n{name}: {p.planned_runs()} runs planned (cap {p.run_cap}), {DURATION[name]}" for name, p in PLANS.items()
    )
    description = __doc__.replace("``", "")  # the docstring's RST literals, as plain text
    formatter = argparse.RawDescriptionHelpFormatter
    return parse(StudyOptions, PROG, argv, description, epilog=epilog, formatter_class=formatter)


def _main(argv: list[str] | None) -> int:
    options = _options(argv)
    out = options.out_dir
    problem = unwritable_reason(out, folder=True)  # tried up front: one line, nothing written
    if problem is None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            problem = f"cannot create it: {err.strerror}"
    if problem:
        print(f"{PROG}: error: --out {out}: {problem}", file=sys.stderr)
        return 2
    command = " ".join([PROG, *(argv if argv is not None else sys.argv[1:])])
    t0 = time.perf_counter()
    from ebpo_verl.ops.provenance import code_version

    code_version()  # the commit and dirty state the study starts from (cached), not those when it ends
    if options.what == "report":
        from ebpo_verl.study.saved import report_from_saved

        return report_from_saved(Path(options.study) if options.study else out, out, command, PROG)
    if options.what == "mse":
        from ebpo_verl.study.mse import run_mse_study

        print(run_mse_study(out, command))
        return 0
    from ebpo_verl.study.runner import StudyDirError, claim_out_dir

    if plan := PLANS.get(options.preset):  # a plan study: claim --out, run (or resume) it, print its closing note
        try:
            if options.estimator_names:
                raise StudyDirError(f"--estimators: preset {plan.name} fixes its estimators; leave it out")
            claim_out_dir(out, plan)
            torch.set_num_threads(1)
            print(RUN_PLAN[options.preset](plan, out, command, options.workers))
        except (StudyDirError, RegimeError) as err:
            print(f"{PROG}: error: {err}", file=sys.stderr)
            return 2
        return 0
    preset = PRESETS[options.preset]
    try:
        if options.estimator_names:
            preset = preset.with_estimators(options.estimator_names)
        preset.check_lrs()
        claim_out_dir(out, preset)
    except (StudyDirError, ValueError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    _run_study(options, preset, command, t0)
    return 0


def _run_study(options: StudyOptions, preset: Any, command: str, t0: float) -> None:
    """The warm start, the tuning grid, then the preset's grid and report (a tuning preset: its choice, written
    to ``lr_tuning.json`` with its grid and provenance)."""
    from ebpo_verl.study.report import study_provenance
    from ebpo_verl.study.runner import describe_base, grid, lr_grid_of, prepare_base, run_grid, write_json
    from ebpo_verl.study.writeup import write_report

    out = options.out_dir
    torch.set_num_threads(1)
    print(f"warm start: {preset.sft_steps} supervised steps (or the one saved in {out}) ...", flush=True)
    base = prepare_base(preset, out)
    info = describe_base(base)
    print(f"warm start ready: held-out pass@1 {info['heldout_accuracy']:.3f}")
    tuning, resumed = run_grid(preset, base, out, preset.tuning_runs(), options.workers)
    lr_grid = lr_grid_of(preset, tuning)
    if not preset.group_sizes:  # a tuning preset: its choice is the output
        seconds = time.perf_counter() - t0
        write_json(out / "lr_tuning.json", {
            "preset": preset.name,
            "command": command,
            "n_runs": len(tuning),
            "wall_seconds": round(seconds, 1),
            "cpu_seconds": round(info["sft_cpu_seconds"] + sum(r["cpu_seconds"] for r in tuning), 1),
            "tune": preset.tune,
            "steps": preset.rl["steps"],
            "split": "validation",
            "lr_grid": {e: {k: v for k, v in g.items() if k != "source"} for e, g in lr_grid.items()},
            "provenance": study_provenance(preset, seconds, command),
        })  # fmt: skip
        write_json(out / "runs.json", {"preset": options.preset, "base": info, "runs": tuning})
        for e, g in lr_grid.items():
            print(f"{e}: lr {g['chosen']:g} (validation {[v[0] for v in g['validation']]} at {g['values']})")
        print(f"\n{len(tuning)} runs in {seconds:.0f} s; wrote {out / 'lr_tuning.json'}")
        return
    lrs = {e: g["chosen"] for e, g in lr_grid.items()}
    runs, resumed_main = run_grid(preset, base, out, grid(preset, lrs), options.workers)
    resumed += resumed_main
    seconds = time.perf_counter() - t0
    write_json(out / "runs.json", {"preset": options.preset, "base": info, "runs": runs, "tuning_runs": tuning})
    headline = write_report(out, preset, info, runs, seconds, command, resumed, lr_grid, len(tuning))
    print(f"\nFinal held-out accuracy (rows = estimator, columns = G), warm start {info['heldout_accuracy']:.3f}:")
    print(headline)
    print(f"\n{len(runs)} runs ({resumed} resumed) in {seconds:.0f} s; report: {out / 'study.md'}")


if __name__ == "__main__":
    raise SystemExit(main())
