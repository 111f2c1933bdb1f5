"""``python -m ebpo_verl.recipes run MODEL | table NAME | eval TARGET [args]``: the recipes' command line (from an
installed package; in a checkout, ``recipe/ebpo/*.sh`` exec it).

Switches are environment variables (``--help`` of each command lists them); every refusal is one line
``ebpo recipe: ...`` on stderr with exit status 2.
"""

from __future__ import annotations

import os
import sys
import textwrap

from ebpo_verl.evaluate.prompts import BENCHMARKS
from ebpo_verl.recipes.presets import ALIASES, ORDERS, PRESETS
from ebpo_verl.recipes.spec import Model, RecipeError, model_tags
from ebpo_verl.recipes.tables import TABLES


def _algos() -> str:
    lines = [f"  {name:<13} {p.summary}" for name, p in PRESETS.items()]
    return "\n".join(lines) + f"\n  (earlier names still accepted: {', '.join(f'{a}={b}' for a, b in ALIASES.items())})"


RUN_SWITCHES = f"""\
Switches (environment variables; presets and their sources: ebpo_verl/recipes/presets.py):
  ALGO          the preset (default ebpo):
{textwrap.indent(_algos(), "  ")}
  BASELINES     paper (default: each baseline as the authors ran it) | canonical (as its own paper and
                verl's docs define it); docs/baselines.md
  REWARD        paper (default: the authors' `Answer:` rule, +1/-1, ebpo_verl.paper_reward) |
                math_verify (ebpo_verl.reward: math-verify, 1/0)
  GROUP_SIZE    responses per prompt G (rollout.n), an integer >= 2 (>= 1 for spo)          default 4
  TRAIN_BATCH   prompts per step (data.train_batch_size); the rivals table: 2048 / G      default 512
  ORDER         {" | ".join(ORDERS)}: topic (default) | naive (file order, EBPO-naive) | difficulty | random
  TOPICS        labels for ORDER=topic: embed (default: all-MiniLM-L6-v2 + UMAP + k-means, K=10, seed 42) |
                file (TRAIN_FILE carries extra_info.topic)
  MODEL_PATH    HF id or local path of the policy                         default: the model config's
  WORK_DIR      root of everything below (multi-node: a folder every node sees)      default ./ebpo_runs
  DATA_DIR      prepared parquet files (prepared here when missing)                default WORK_DIR/data
  DATA_LOCAL_DIR  ebpo_verl.data.all reads the datasets from files there instead of the hub
  TRAIN_FILE    training parquet                      default: derived from DATA_DIR, ORDER and TOPICS
  CKPT_DIR      checkpoints go to CKPT_DIR/EXPERIMENT                              default WORK_DIR/ckpt
  KEEP_CKPTS    checkpoints kept per run (~12 bytes per parameter each)                        default 2
  LOG_DIR       metrics go to LOG_DIR/EXPERIMENT/metrics.jsonl (append-only)       default WORK_DIR/logs
  NNODES, GPUS_PER_NODE                                                                default 4 and 8
  PROJECT       trainer.project_name                                                       default ebpo
  EXPERIMENT    default <model>-<ALGO>-g<GROUP_SIZE>-<ORDER>-rw_<REWARD>-bl_<BASELINES>
  TOTAL_STEPS   if set, trainer.total_training_steps (the run stops there)
  TOTAL_EPOCHS  default TOTAL_STEPS when that is set, else 1 for ORDER=difficulty and 3 otherwise
  TEST_FREQ, SAVE_FREQ  validation / checkpoint period in steps (-1: never)             default 10 and 10
  VAL_SETS      validation sets, comma separated, of {" ".join(BENCHMARKS)}       default all
  VAL_N         samples per validation problem                                               default 16
  PYTHON        interpreter with ebpo-verl installed (the scripts start it)              default python3
  LOGGERS       trainer.logger, e.g. [console,wandb]                                 default [console]
Modes: DRY_RUN=1 lists the data preparation, runs the pre-flight (our checks, verl's validate_config at
NNODES x GPUS_PER_NODE, steps per epoch when the training file exists), prints the composed config and
exits without Ray, GPUs or any file written; PRINT_OVERRIDES=1 prints the Hydra overrides and exits.
Extra arguments are Hydra overrides, applied last. Evaluation: python -m ebpo_verl.recipes eval --help."""

DRIVE_SWITCHES = """\
Table drivers: every run switch (run qwen3_8b --help) can be set and reaches each run; defaults
REWARD=paper, BASELINES=paper and the authors' schedule (validation on AIME24 x 8 before training and
every 5 steps, a checkpoint every 10, KEEP_CKPTS=2).
  FINAL_EVAL    1 (default): evaluate each run's last checkpoint (recipes eval) and tabulate that; 0: tabulate
                the training runs' own validations (LOG_DIR/<experiment>)
  EVAL_PROTOCOL paper (default) | verl | both: the evaluation's protocol; one table per protocol
  SELECT        final (default) | best: which validation of a run the table reports (FINAL_EVAL=0)
  METRICS       pass@1 (default); e.g. "pass@1 pass@16 maj@16 avg@n": one table per metric (FINAL_EVAL=1;
                make_tables --metric, docs/evaluation.md#coverage)
  RESULTS_DIR   tables go to RESULTS_DIR/rw_<REWARD>-bl_<BASELINES>/<protocol>/<table>.md
                                                                             default WORK_DIR/results
  SHOW_CONFIG   1: a dry run also prints each run's composed config (stdout)
`--list` prints the runs (section, method, experiment, results, command) and exits; other arguments are
Hydra overrides for every training run (trainer.default_local_dir / experiment_name / metrics_log_path are
refused: use CKPT_DIR / LOG_DIR). Names: <model>-<algo>-g<G>-<order>-rw_<REWARD>-bl_<BASELINES>, plus
-v<hash> when a schedule switch differs from the driver's default or overrides are given (a hash of those,
the overrides sorted by key: the same overrides in any order name the same run). A finished run
(LOG_DIR/<name>/.done) is not trained again and an evaluation whose results exist is not repeated, so drivers
share runs and can be restarted. DRY_RUN=1 (or PRINT_OVERRIDES=1) shows one block per untrained run (its
switches, what its preset changes, the pre-flight's result) and the evaluation and table commands, and runs,
marks and writes nothing else."""

EVAL_HELP = f"""\
Pass@1 of a model on {", ".join(BENCHMARKS)}: generation (python -m ebpo_verl.evaluate generate), then
grading (... grade).
  python -m ebpo_verl.recipes eval TARGET [extra generate args, e.g. --engine hf --limit 2 --max-new-tokens 64]
  (in a checkout: bash recipe/ebpo/eval.sh TARGET ...)
TARGET: a verl checkpoint (.../<experiment>/global_step_N), a checkpoint root (its latest step), a local
Hugging Face folder or a hub id.
  EVAL_PROTOCOL  paper (default: the authors' raw prompt + Answer: grader) | verl (chat template +
                 ebpo_verl.reward) | both
  EVAL_DIR       default WORK_DIR/eval/<name> (<experiment>-step<N>, or the model folder's name)
  WORK_DIR, DATA_DIR, DATA_LOCAL_DIR, PYTHON   as for the run scripts
Writes EVAL_DIR/<protocol>/generations.jsonl and EVAL_DIR/results-<protocol>.json; a rerun resumes.
Trust: a verl checkpoint TARGET is first merged with verl's merge logic, its .pt shards read with
torch.load(weights_only=True) and only FSDP's tensor and placement types allowed: a shard carrying anything else
is refused. --trust-checkpoint merges with verl's merger as it is, torch.load(weights_only=False), i.e. unpickles
the shards: it runs code from the file; pass it only for checkpoints you trust as you would trust code. A Hugging
Face folder or hub id loads safetensors without unpickling (docs/evaluation.md#trust)."""


def usage(command: str, name: str) -> str:
    if command == "run":
        model = Model.load(name)
        lines = f"  python -m ebpo_verl.recipes run {name} [hydra overrides]   (or bash recipe/ebpo/run_{name}.sh)"
        return f"{model.description}\n{lines}\n\n{RUN_SWITCHES}"
    if command == "table":
        usage_line = (
            f"  python -m ebpo_verl.recipes table {name} [--help | --list | hydra overrides for every run]\n"
            f"  (in a checkout: bash recipe/ebpo/table_{name}.sh ...)"
        )
        return f"{TABLES[name].about}\n{usage_line}\n\n{DRIVE_SWITCHES}"
    return EVAL_HELP


TOP_HELP = """\
The recipes' commands (each answers --help):
  python -m ebpo_verl.recipes run MODEL [hydra overrides]     one training run; MODEL: {models}
  python -m ebpo_verl.recipes table NAME [--list | overrides] a paper table's runs, evaluations and table;
                                                               NAME: {tables}
  python -m ebpo_verl.recipes eval TARGET [generate args]     pass@1 of a checkpoint or model
In a checkout, recipe/ebpo/*.sh exec these commands."""


def _is_help(arg: str) -> bool:
    return arg in ("-h", "--help")


def help_text(argv: list[str]) -> str | None:
    """The help that ``argv`` asks for at whichever level it stops (None: it asks for none). ``run --help``
    and ``table --help`` list the models / tables; ``run MODEL --help`` the run's switches."""
    commands = {"run": model_tags(), "table": list(TABLES)}
    if not argv or not any(_is_help(a) for a in argv):
        return None
    if _is_help(argv[0]) or argv[0] not in (*commands, "eval"):
        return TOP_HELP.format(models=" ".join(commands["run"]), tables=" ".join(commands["table"]))
    command, rest = argv[0], argv[1:]
    if command == "eval":
        return EVAL_HELP
    if _is_help(rest[0]):
        what = "MODEL" if command == "run" else "NAME"
        return (
            f"usage: python -m ebpo_verl.recipes {command} {what} [args]; {what} one of: "
            f"{' '.join(commands[command])}\n{command} {what} --help lists its switches"
        )
    if rest[0] not in commands[command]:
        return None  # refused below, naming the choices
    return usage(command, rest[0])


def main(argv: list[str] | None = None) -> int:
    from ebpo_verl.recipes import driver

    argv = sys.argv[1:] if argv is None else argv
    commands = {"run": model_tags(), "table": list(TABLES), "eval": None}
    text = help_text(argv)
    if text is not None:
        print(text)
        return 0
    if len(argv) < 2 and not (argv and argv[0] == "eval") or argv[0] not in commands:
        print(
            "usage: python -m ebpo_verl.recipes {run MODEL | table NAME | eval TARGET} [args] (--help at any level)",
            file=sys.stderr,
        )
        return 2
    command, rest = argv[0], argv[1:]
    name = rest[0] if command != "eval" else ""
    args = rest[1:] if command != "eval" else rest
    try:
        if commands[command] is not None and name not in commands[command]:
            raise RecipeError(f"unknown {command} {name!r} (one of: {' '.join(commands[command])})")
        env = dict(os.environ)
        if command == "run":
            return driver.run(name, args, env)
        if command == "table":
            return driver.drive(name, args, env)
        return driver.evaluate(args[0] if args else "", args[1:], env)
    except RecipeError as err:
        print(f"ebpo recipe: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
