"""What the recipe scripts do: one training run (``run``), the final evaluation of a model (``evaluate``) and a
paper table (``drive``: train what is not trained, evaluate what is not evaluated, tabulate).

Each entry point reads its switches from the environment once (:class:`~ebpo_verl.recipes.spec.RunSpec`) and
refuses a bad one with a :class:`~ebpo_verl.recipes.spec.RecipeError`; the commands it runs are
:func:`execute`'s (tests replace it).
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from omegaconf import OmegaConf

from ebpo_verl.evaluate.merge import resolve_model
from ebpo_verl.evaluate.prompts import BENCHMARKS, EvalInputError
from ebpo_verl.ops.model_ref import model_reference_problem
from ebpo_verl.options.parsing import OptionSection
from ebpo_verl.recipes.make_tables import DEFAULT_METRIC, check_metric
from ebpo_verl.recipes.presets import PRESETS, SHARED
from ebpo_verl.recipes.spec import SCHEDULE_VARS, RecipeError, RunSpec, Shared, data_command, python, variant_suffix
from ebpo_verl.recipes.switches import DriveSwitches, EvalSwitches, Modes, chosen_protocols
from ebpo_verl.recipes.tables import TABLES, Row, Table

RECIPES = "ebpo_verl.recipes"
"""The command line every planned command goes through (``python -m ebpo_verl.recipes``): it works from an
installed package; ``recipe/ebpo/*.sh`` in a checkout are shims over it."""
DRIVER_PATHS = ("default_local_dir", "experiment_name", "metrics_log_path")
"""trainer.* keys a table driver sets per run (the evaluation and the tables read them)."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def execute(command: Sequence[str]) -> int:
    """Run one command (inheriting this process's environment); its exit status."""
    return subprocess.run(list(command), check=False).returncode


S = TypeVar("S", bound=OptionSection)


def switches(cls: type[S], env: Mapping[str, str]) -> S:
    """The switches ``cls`` declares, read from ``env``; a bad value is a RecipeError in one line."""
    try:
        return cls.from_variables(env)
    except ValueError as err:
        raise RecipeError(str(err)) from None


# ----------------------------------------------------------------------------------------------- one run
def prepare(spec: RunSpec, dry: bool) -> list[str]:
    """Prepare the missing data files (DRY_RUN: only list the commands) and return the training command. First the
    paths a run never creates itself (in a dry run too): the model (a folder or a hub id; the trainer's pre-flight
    checks it again) and a user-given TRAIN_FILE. Before a download from the hub (no DATA_LOCAL_DIR), a hub that
    does not answer is one RecipeError naming DATA_LOCAL_DIR."""
    if problem := model_reference_problem(spec.model_path):
        raise RecipeError(f"MODEL_PATH={problem}; give a Hugging Face model folder or a hub id")
    if spec.train_file and "://" not in spec.train_file and not os.path.isfile(spec.train_file):
        raise RecipeError(f"TRAIN_FILE={spec.train_file} does not exist (or is not a file); fix the path")
    commands = spec.preparation()
    if not dry and not spec.shared.data_local_dir and any(c[1:3] == ["-m", "ebpo_verl.data.all"] for c in commands):
        from ebpo_verl.data.sources import DataPrepError, check_hub

        try:
            check_hub(fix="set DATA_LOCAL_DIR to a folder with the dataset files (docs/data.md)")
        except DataPrepError as err:
            raise RecipeError(f"data preparation: {err}") from None
    for command in commands:
        if dry:
            log(f"DRY_RUN: would prepare data: {shlex.join(command)}")
            continue
        log(f"ebpo recipe: {shlex.join(command)}")
        if execute(command) != 0:
            raise RecipeError(f"data preparation failed: {shlex.join(command)}")
    if not dry and not os.path.isfile(spec.train_path):
        raise RecipeError(f"training file not found: {spec.train_path}")
    if not dry:
        os.makedirs(spec.log_dir, exist_ok=True)
    return spec.command()


def preflight_summary(spec: RunSpec) -> tuple[bool, str, str]:
    """(passed, the pre-flight's line, the composed config as YAML) of a run, in this process (verl's
    validate_config chatter on stdout is swallowed)."""
    from ebpo_verl.main import dry_run
    from ebpo_verl.ops.errors import EBPOConfigError

    with contextlib.redirect_stdout(io.StringIO()):
        try:
            config, lines = dry_run(spec.overrides())
        except EBPOConfigError as err:
            return False, f"refused: {err}", ""
    return True, f"ok ({'; '.join(lines)})", OmegaConf.to_yaml(config)


def preflight_first(spec: RunSpec) -> None:
    """The whole pre-flight (overrides, composition, our checks, verl's validate_config) before any data is
    prepared, so a misspelled override is refused in seconds; a refusal is one RecipeError. The trainer runs it
    again on the prepared files (steps per epoch)."""
    passed, line, _ = preflight_summary(spec)
    if not passed:
        raise RecipeError(f"pre-flight {line}")


def run(model: str, args: Sequence[str], env: Mapping[str, str]) -> int | None:
    """``run_<model>.sh``: PRINT_OVERRIDES=1 prints the overrides; DRY_RUN=1 lists the data preparation, runs the
    pre-flight (``python -m ebpo_verl.main --cfg job``) and prints the config; otherwise runs the pre-flight,
    prepares the missing data and replaces this process with the trainer (``os.execvp``: no return)."""
    modes = switches(Modes, env)
    spec = RunSpec.from_env(model, env, args)
    if modes.PRINT_OVERRIDES:
        print("\n".join(spec.overrides()))
        return 0
    if not modes.DRY_RUN:
        preflight_first(spec)
        command = prepare(spec, dry=False)
        return os.execvp(command[0], command)
    # ``ebpo-train --cfg job`` in this process, through the same dry_run as preflight_summary: the pre-flight and
    # the config on stdout (a refusal exits 2 with one line), then what was and was not checked
    from ebpo_verl.main import show_job

    prepare(spec, dry=True)
    show_job(spec.overrides())
    sh = spec.shared
    steps = (f", steps per epoch of {spec.train_path}" if os.path.isfile(spec.train_path)
             else f"; steps per epoch not checked: {spec.train_path} is not prepared yet")  # fmt: skip
    log(f"DRY_RUN: pre-flight passed (our checks, verl's validate_config at {sh.nnodes} x {sh.gpus_per_node} GPUs"
        f"{steps}); nothing was prepared, written or started")  # fmt: skip
    return 0


# -------------------------------------------------------------------------------------------- evaluation
def eval_name(target: str) -> str:
    """The evaluation's folder name: ``<experiment>-step<N>`` for a checkpoint root or step, else the folder's."""
    path = Path(target.rstrip("/"))
    latest = path / "latest_checkpointed_iteration.txt"
    if latest.is_file():
        return f"{path.name}-step{latest.read_text().strip()}"
    if path.name.startswith("global_step_"):
        return f"{path.parent.name}-step{path.name.removeprefix('global_step_')}"
    return path.name


def evaluate(target: str, args: Sequence[str], env: Mapping[str, str]) -> int:
    """``python -m ebpo_verl.recipes eval TARGET [generate args]`` (``eval.sh``): check TARGET, prepare missing
    benchmark files, then generate and grade per protocol."""
    if not target or target.startswith("-"):
        raise RecipeError("usage: python -m ebpo_verl.recipes eval TARGET [extra generate args]")
    target = target.rstrip("/")
    try:  # the target first: nothing is prepared for a model that is not there
        resolve_model(target)
    except EvalInputError as err:
        raise RecipeError(f"eval {err}") from None
    own = switches(EvalSwitches, env)
    chosen = chosen_protocols(own.EVAL_PROTOCOL)
    shared = Shared.from_env(env)
    paths = shared.paths
    out = own.EVAL_DIR or os.path.join(paths.work, "eval", eval_name(target))
    missing = [b for b in BENCHMARKS if not os.path.isfile(os.path.join(paths.data, f"{b}.parquet"))]
    if missing:
        log(f"eval.sh: preparing {' '.join(missing)} in {paths.data}")
        if execute(data_command(paths.data, missing, shared.data_local_dir)):
            raise RecipeError("data preparation failed")
    for protocol in chosen:
        log(f"eval.sh: {target}, protocol {protocol} -> {out}")
        generations = os.path.join(out, protocol, "generations.jsonl")
        steps = [
            [python(), "-m", "ebpo_verl.evaluate", "generate", "--model", target, "--data-dir", paths.data,
             "--protocol", protocol, "--out", generations, *args],
            [python(), "-m", "ebpo_verl.evaluate", "grade", "--protocol", protocol, "--generations", generations,
             "--data-dir", paths.data, "--out", os.path.join(out, f"results-{protocol}.json")],
        ]  # fmt: skip
        for command in steps:
            if status := execute(command):
                return status
    return 0


# ---------------------------------------------------------------------------------------------- a table
@dataclass(frozen=True)
class Experiment:
    """A table row resolved against the environment: its run spec and the files the table reads."""

    row: Row
    spec: RunSpec
    words: tuple[str, ...]
    """``VAR=value`` words that rerun it by hand with ``python -m ebpo_verl.recipes run <model>``."""

    @property
    def name(self) -> str:
        return self.spec.experiment

    def result(self, protocol: str) -> str:
        if protocol == "train_val":
            return self.spec.log_dir
        return os.path.join(self.spec.shared.paths.work, "eval", self.name, f"results-{protocol}.json")

    def command(self) -> str:
        run = [python(), "-m", RECIPES, "run", self.row.model]
        return shlex.join([*self.words, f"EXPERIMENT={self.name}", *run])


def schedule_items(env: Mapping[str, str], defaults: Mapping[str, str]) -> list[str]:
    """``VAR=value`` of each schedule switch that differs from the driver's default (VAL_SETS normalised)."""
    items = []
    for var in SCHEDULE_VARS:
        value = env.get(var) or defaults.get(var, "")
        if var == "VAL_SETS":
            value = ",".join(part for part in value.replace(" ", ",").split(",") if part)
        if value != defaults.get(var, ""):
            items.append(f"{var}={value}")
    return items


def experiments(table: Table, env: Mapping[str, str], overrides: Sequence[str]) -> list[Experiment]:
    """The table's runs: each row's switches over the environment over the driver's schedule; the names carry
    ``-rw_<REWARD>-bl_<BASELINES>`` and the variant suffix of a non-default schedule or extra overrides."""
    env = {k: v for k, v in env.items() if v}
    if "TRAIN_BATCH" in env:  # the run names would not show it: another batch under a shared run's name
        raise RecipeError("TRAIN_BATCH is set per row by the table drivers (rivals: 2048 / G); unset it")
    defaults = table.schedule_defaults()
    shared = Shared.from_env(env)
    suffix = variant_suffix(schedule_items(env, defaults), overrides)
    base = {**defaults, "KEEP_CKPTS": "2", **env}
    out, seen = [], set()
    for row in table.rows(env, shared.baselines):
        name = f"{row.name}-rw_{shared.reward}-bl_{shared.baselines}{suffix}"
        if name in seen:
            raise RecipeError(f"experiment name used twice in table {table.name}: {name}")
        seen.add(name)
        spec = RunSpec.from_env(row.model, {**base, **row.env, "EXPERIMENT": name}, overrides)
        words = [f"MODEL={row.model}", f"REWARD={shared.reward}", f"BASELINES={shared.baselines}"]
        words += [f"{var}={base[var]}" for var in (*SCHEDULE_VARS, "KEEP_CKPTS") if base.get(var)]
        words += [f"{k}={v}" for k, v in row.env.items()]
        out.append(Experiment(row, spec, tuple(words)))
    return out


def drive(name: str, overrides: Sequence[str], env: Mapping[str, str], listing: bool = False) -> int:
    """``table_<name>.sh``: ``listing`` (``--list``) prints the runs; otherwise the pre-flight of every run still to
    train, then train (unless ``LOG_DIR/<run>/.done``), evaluate (unless its results exist; FINAL_EVAL=1), then
    tabulate. DRY_RUN=1 / PRINT_OVERRIDES=1: :func:`_show` per run, the evaluation and table commands; nothing
    else. ``overrides``: Hydra overrides for every training run."""
    table = TABLES[name]
    for arg in overrides:
        key = arg.split("=", 1)[0].lstrip("+")
        if key.startswith("trainer.") and key.removeprefix("trainer.") in DRIVER_PATHS and "=" in arg:
            raise RecipeError(f"a table driver sets {key} per run (evaluation and tables read it): drop {arg} and "
                              "set CKPT_DIR / LOG_DIR instead")  # fmt: skip
    own = switches(DriveSwitches, env)  # checked before anything runs: the protocols tabulated, the metrics
    chosen = chosen_protocols(own.EVAL_PROTOCOL) if own.FINAL_EVAL else ["train_val"]
    try:
        metrics = [check_metric(metric) for metric in dict.fromkeys(own.METRICS.split())]
    except ValueError as err:
        raise RecipeError(f"METRICS: {err}") from None
    if not own.FINAL_EVAL and metrics != [DEFAULT_METRIC]:
        raise RecipeError(f"METRICS={' '.join(metrics)} needs FINAL_EVAL=1: a run's own validations hold pass@1 only")
    modes = switches(Modes, env)
    runs = experiments(table, env, overrides)
    if listing:
        print("section\tmethod\texperiment\tresults\tcommand")
        for e in runs:
            results = ",".join(e.result(p) for p in chosen)
            print(f"{e.row.section}\t{e.row.method}\t{e.name}\t{results}\t{e.command()}")
        return 0
    dry = modes.dry
    for e in [] if dry else runs:  # every run's pre-flight before the first preparation or training
        try:
            if not os.path.isfile(os.path.join(e.spec.log_dir, ".done")):
                preflight_first(e.spec)
        except RecipeError as err:
            raise RecipeError(f"{e.name}: {err}") from None
    failed = []
    for e in runs:
        if os.path.isfile(done := os.path.join(e.spec.log_dir, ".done")):
            log(f"== {e.name}: trained before, not run again")
        elif dry:
            failed += _show(e, modes)
        else:
            log(f"== {e.name}: {' '.join(e.words)}")
            if execute(prepare(e.spec, dry=False)) != 0:
                failed.append(f"{e.name} (training)")
                continue
            Path(done).touch()
        if not own.FINAL_EVAL:
            continue
        command = ["env", f"EVAL_PROTOCOL={own.EVAL_PROTOCOL}",
                   f"EVAL_DIR={os.path.join(e.spec.shared.paths.work, 'eval', e.name)}",
                   python(), "-m", RECIPES, "eval", e.spec.ckpt_dir]  # fmt: skip
        if all(os.path.isfile(e.result(p)) for p in chosen):
            log(f"== {e.name}: evaluated before, not run again")
        elif dry:
            log(f"DRY_RUN: would evaluate: {shlex.join(command)}")
        elif execute(command) != 0:
            failed.append(f"{e.name} (evaluation)")
    results = os.path.join(own.RESULTS_DIR or os.path.join(runs[0].spec.shared.paths.work, "results"),
                           f"rw_{runs[0].spec.shared.reward}-bl_{runs[0].spec.shared.baselines}")  # fmt: skip
    for protocol in chosen:
        command = [python(), "-m", f"{RECIPES}.make_tables", "--table", name, "--select", own.SELECT,
                   "--out", os.path.join(results, protocol)]  # fmt: skip
        command += [f"{e.row.section}/{e.row.method}={e.result(protocol)}" for e in runs]
        command += ["--metric", *metrics] if metrics != [DEFAULT_METRIC] else []  # last: it takes every word after it
        if dry:
            log(f"DRY_RUN: would tabulate: {shlex.join(command)}")
        elif execute(command) != 0:
            failed.append(f"tables ({protocol})")
    if failed:
        raise RecipeError(f"failed (their cells are empty): {' '.join(failed)}")
    return 0


def _show(e: Experiment, modes: Modes) -> list[str]:
    """A dry run's block for one run; the failure to report, if its pre-flight refused it."""
    spec = e.spec
    log(f"== {e.name} ({e.row.section} / {e.row.method}), dry run")
    log(f"   switches: {' '.join(e.words)}")
    shared = {s.name: s.value for s in SHARED}  # what the preset changes from the shared setup:
    changed = " ".join(
        s.override for s in PRESETS[spec.algo].settings(spec.shared.baselines) if shared.get(s.name) != s.value
    )
    log(f"   preset {spec.algo} (BASELINES={spec.shared.baselines}): {changed or 'the shared setup'}")
    for command in spec.preparation():
        log(f"   would prepare data: {shlex.join(command)}")
    if modes.PRINT_OVERRIDES:
        print("\n".join(spec.overrides()))
        return []
    passed, line, config = preflight_summary(spec)
    log(f"   pre-flight: {line}")
    if passed and modes.SHOW_CONFIG:
        print(f"# {e.name}\n{config}")
    return [] if passed else [f"{e.name} (pre-flight)"]
