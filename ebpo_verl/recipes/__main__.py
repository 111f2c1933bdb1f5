"""``python -m ebpo_verl.recipes run MODEL | table NAME | eval TARGET [args]``: the recipes' command line (from an
installed package; in a checkout, ``recipe/ebpo/*.sh`` exec it).

Switches are environment variables (``--help`` of each command lists them). A refused command line is one line
``python -m ebpo_verl.recipes ...: error: ...``, a refused switch or target one line ``ebpo recipe: ...``, on
stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from dataclasses import MISSING, dataclass
from typing import ClassVar

from ebpo_verl.evaluate.prompts import BENCHMARKS
from ebpo_verl.options.cli import OneLineParser, add_options, parse_options, switches_help
from ebpo_verl.options.parsing import PATH, OptionSection, option
from ebpo_verl.recipes.presets import ALIASES, PRESETS
from ebpo_verl.recipes.spec import Model, RecipeError, RunSwitches, model_tags
from ebpo_verl.recipes.switches import DriveSwitches, EvalSwitches, Modes
from ebpo_verl.recipes.tables import TABLES

PROG = "python -m ebpo_verl.recipes"


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


def about(command: str, name: str) -> str:
    """The --help of ``run MODEL`` / ``table NAME`` after its usage line: what it is, its script, its switches."""
    if command == "run":
        return f"{Model.load(name).description}\n(in a checkout: bash recipe/ebpo/run_{name}.sh ...)\n\n{RUN_SWITCHES}"
    return f"{TABLES[name].about}\n(in a checkout: bash recipe/ebpo/table_{name}.sh ...)\n\n{DRIVE_SWITCHES}"


TOP_HELP = """\
The recipes' commands (each answers --help):
  python -m ebpo_verl.recipes run MODEL [hydra overrides]     one training run; MODEL: {models}
  python -m ebpo_verl.recipes table NAME [--list | overrides] a paper table's runs, evaluations and table;
                                                               NAME: {tables}
  python -m ebpo_verl.recipes eval TARGET [generate args]     pass@1 of a checkpoint or model
In a checkout, recipe/ebpo/*.sh exec these commands."""


@dataclass(frozen=True)
class TableOptions(OptionSection):
    """``table NAME``'s own option; its other arguments are Hydra overrides for every training run."""

    SECTION: ClassVar[str] = "table"
    listing: bool = option(
        False, "print the runs (section, method, experiment, results, command) and exit", choices=(True, False),
        flag="--list",
    )  # fmt: skip


@dataclass(frozen=True)
class EvalOptions(OptionSection):
    """``eval TARGET``; its other arguments go to ``python -m ebpo_verl.evaluate generate``."""

    SECTION: ClassVar[str] = "eval"
    target: str = option(
        MISSING, "a verl checkpoint, a checkpoint root, a local Hugging Face folder or a hub id", rule=PATH,
        flag="TARGET",
    )  # fmt: skip


def parser() -> OneLineParser:
    """The command line: ``run MODEL`` and ``table NAME`` (one parser per model / table, whose --help is its
    switches) and ``eval``; what a command does not declare passes through (Hydra overrides, generate args)."""
    own = {"formatter_class": argparse.RawDescriptionHelpFormatter, "allow_abbrev": False}
    models, tables = model_tags(), list(TABLES)
    top = OneLineParser(prog=PROG, description=TOP_HELP.format(models=" ".join(models), tables=" ".join(tables)), **own)
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)
    for command, what, names in (("run", "MODEL", models), ("table", "NAME", tables)):
        choose = f"{what} one of: {' '.join(names)}\n{command} {what} --help lists its switches"
        level = commands.add_parser(command, description=choose, **own)
        choices = level.add_subparsers(dest="name", required=True, metavar=what, parser_class=OneLineParser)
        for name in names:
            args = "[hydra overrides]" if command == "run" else "[--list] [hydra overrides for every run]"
            leaf = choices.add_parser(name, usage=f"{PROG} {command} {name} {args}", description=about(command, name),
                                      **own)  # fmt: skip
            if command == "table":
                add_options(leaf, TableOptions)
    evaluate = commands.add_parser("eval", usage=f"{PROG} eval TARGET [generate args]", description=EVAL_HELP, **own)
    add_options(evaluate, EvalOptions)
    return top


def main(argv: list[str] | None = None) -> int | None:
    from ebpo_verl.recipes import driver

    top = parser()
    args, passed = top.parse_known_args(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    try:
        if args.command == "run":
            return driver.run(args.name, passed, env)
        if args.command == "table":
            return driver.drive(args.name, passed, env, parse_options(TableOptions, args, top).listing)
        return driver.evaluate(parse_options(EvalOptions, args, top).target, passed, env)
    except RecipeError as err:
        print(f"ebpo recipe: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
