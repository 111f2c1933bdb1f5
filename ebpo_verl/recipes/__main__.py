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
from ebpo_verl.options.cli import switches_help
from ebpo_verl.recipes.presets import ALIASES, PRESETS
from ebpo_verl.recipes.spec import Model, RecipeError, RunSwitches, model_tags
from ebpo_verl.recipes.switches import DriveSwitches, EvalSwitches, Modes
from ebpo_verl.recipes.tables import TABLES


def _algos() -> str:
    lines = [f"  {name:<13} {p.summary}" for name, p in PRESETS.items()]
    return "\n".join(lines) + f"\n  (earlier names still accepted: {', '.join(f'{a}={b}' for a, b in ALIASES.items())})"


RUN_SWITCHES = f"""\
Switches (environment variables; an empty one is unset; presets and their sources: ebpo_verl/recipes/presets.py):
{switches_help(RunSwitches, {"ALGO": textwrap.indent(_algos(), "    ")})}
Modes:
{switches_help(Modes)}
A dry run's pre-flight is ours and verl's validate_config at NNODES x GPUS_PER_NODE, with the steps per epoch when
the training file exists. Extra arguments are Hydra overrides, applied last. Evaluation: python -m
ebpo_verl.recipes eval --help."""

DRIVE_SWITCHES = f"""\
Table drivers: every run switch (run qwen3_8b --help) can be set and reaches each run; defaults
REWARD=paper, BASELINES=paper and the authors' schedule (validation on AIME24 x 8 before training and
every 5 steps, a checkpoint every 10, KEEP_CKPTS=2). Their own switches:
{switches_help(DriveSwitches)}
Modes (DRY_RUN=1 or PRINT_OVERRIDES=1: one block per untrained run, its switches, what its preset changes, the
pre-flight's result, then the evaluation and table commands; runs, marks and writes nothing else):
{switches_help(Modes)}
`--list` prints the runs (section, method, experiment, results, command) and exits; other arguments are
Hydra overrides for every training run (trainer.default_local_dir / experiment_name / metrics_log_path are
refused: use CKPT_DIR / LOG_DIR). Names: <model>-<algo>-g<G>-<order>-rw_<REWARD>-bl_<BASELINES>, plus
-v<hash> when a schedule switch differs from the driver's default or overrides are given (a hash of those,
the overrides sorted by key: the same overrides in any order name the same run). A finished run
(LOG_DIR/<name>/.done) is not trained again and an evaluation whose results exist is not repeated, so drivers
share runs and can be restarted."""

EVAL_HELP = f"""\
Pass@1 of a model on {", ".join(BENCHMARKS)}: generation (python -m ebpo_verl.evaluate generate), then
grading (... grade).
  python -m ebpo_verl.recipes eval TARGET [extra generate args, e.g. --engine hf --limit 2 --max-new-tokens 64]
  (in a checkout: bash recipe/ebpo/eval.sh TARGET ...)
TARGET: a verl checkpoint (.../<experiment>/global_step_N), a checkpoint root (its latest step), a local
Hugging Face folder or a hub id.
{switches_help(EvalSwitches)}
  WORK_DIR, DATA_DIR, DATA_LOCAL_DIR, PYTHON   as for the run scripts
Protocols: paper (the authors' raw prompt + Answer: grader) | verl (chat template + ebpo_verl.reward).
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
