"""``python -m ebpo_verl.docs_tables [--check]``: the one docs command. It writes every generated part of the
checkout from its declarations: ``ebpo_trainer.yaml`` (the Hydra config) and each block of :func:`pages` between
``<!-- generated:NAME:begin -->`` / ``<!-- generated:NAME:end -->`` lines (:mod:`ebpo_verl.ops.readme_block`): the
options tables, the estimator tables, the README's CPU-study tables and the recipe's status table. ``--check``
writes nothing and exits 1 naming each file that differs (the tests and ``.ci/run`` run it); bad input (a missing
marker or summary, an unreadable results CSV) is one line and exit 2.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ebpo_verl.ops.readme_block import check_or_write, replace_marked_block
from ebpo_verl.options.cli import options_table, parse
from ebpo_verl.options.parsing import PATH, OptionSection, Rule, nullable, option

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python -m ebpo_verl.docs_tables"
YAML = "ebpo_verl/trainer/config/ebpo_trainer.yaml"
RIVALS2 = "docs/study_rivals2/summary.json"


@dataclass(frozen=True)
class DocsOptions(OptionSection):
    """The docs command's options."""

    SECTION: ClassVar[str] = ""

    check: bool = option(False, "write nothing; exit 1 naming each file out of date", choices=(True, False))
    root: str | None = nullable("the checkout whose files are written; null: the one holding this package", PATH)
    study: tuple[str, ...] = option(
        ("quick=docs/study_quick.json",),
        "the README's study-NAME block from the summary.json of python -m ebpo_verl.study (relative to the root)",
        rule=Rule(lambda x: isinstance(x, str) and bool(re.fullmatch(r"[a-z0-9_]+=.+", x)), "NAME=SUMMARY"),
        metavar="NAME=SUMMARY",
    )
    results: tuple[str, ...] = option(
        ("ebpo_runs/results",),
        "folders (relative to the root) searched for make_tables' CSVs: the status table of recipe/ebpo/README.md",
        rule=PATH,
        metavar="DIR",
    )


def _switches(cls: type[OptionSection]) -> Callable[[], str]:
    return lambda: options_table(cls, name=str, unset="unset")


def pages(o: DocsOptions, root: Path) -> dict[str, dict[str, Callable[[], str]]]:
    """Page -> block name -> its text, for options ``o`` and checkout ``root``."""
    from ebpo_verl.evaluate.__main__ import GenerateOptions, GradeOptions
    from ebpo_verl.evaluate.engines import EngineOptions
    from ebpo_verl.recipes import status_table
    from ebpo_verl.recipes.spec import RunSwitches
    from ebpo_verl.recipes.switches import DriveSwitches, EvalSwitches, Modes
    from ebpo_verl.study import readme_tables
    from ebpo_verl.trainer.config import generate

    def study(path: str) -> Callable[[], str]:
        return lambda: readme_tables.render(readme_tables.load_summary(root / path))

    return {
        "README.md": {
            "options": generate.options_table,
            **{f"study-{name}": study(path) for name, _, path in (s.partition("=") for s in o.study)},
        },
        "docs/estimator.md": {"ebpo-options": lambda: generate.option_table(generate.default_estimator().options_cls)},
        "docs/baselines.md": {
            "estimators": generate.estimators_table,
            "estimator-options": generate.baseline_option_tables,
        },
        "docs/evaluation.md": {
            "eval-switches": _switches(EvalSwitches),
            "evaluate-generate": lambda: options_table(GenerateOptions),
            "engine": lambda: options_table(EngineOptions),
            "evaluate-grade": lambda: options_table(GradeOptions),
        },
        "docs/reproduction.md": {
            "run-switches": _switches(RunSwitches),
            "drive-switches": _switches(DriveSwitches),
            "modes": _switches(Modes),
        },
        "recipe/ebpo/README.md": {"status": lambda: status_table.render(root, o.results)},
        "docs/rivals.md": {
            "which-estimator": lambda: readme_tables.which_estimator_table(json.loads((root / RIVALS2).read_text()))
        },
    }


def updated(page: str, text: str, blocks: dict[str, Callable[[], str]]) -> str:
    """``text`` (of ``page``) with each of its ``blocks`` regenerated; ValueError naming the page and the block."""
    for name, block in blocks.items():
        try:
            text = replace_marked_block(text, name, block())
        except ValueError as err:
            raise ValueError(f"{page}: block {name}: {err}") from None
    return text


def main(argv: list[str] | None = None) -> int:
    from ebpo_verl.trainer.config.generate import config_yaml

    o = parse(DocsOptions, COMMAND, argv, __doc__.split("\n\n")[0])
    root = Path(o.root) if o.root else ROOT
    status = 0
    try:
        news = {YAML: ((root / YAML).read_text(encoding="utf-8"), config_yaml())}
        for page, blocks in pages(o, root).items():
            text = (root / page).read_text(encoding="utf-8")
            news[page] = (text, updated(page, text, blocks))
    except (OSError, ValueError) as err:
        print(f"{COMMAND}: error: {err}", file=sys.stderr)
        return 2
    for page, (text, new) in news.items():
        status |= check_or_write(root / page, text, new, o.check, COMMAND)
    return status


if __name__ == "__main__":
    sys.exit(main())
