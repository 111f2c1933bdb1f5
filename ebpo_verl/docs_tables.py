"""``python -m ebpo_verl.docs_tables [--check]``: the option tables of the docs, generated from the declarations
(:func:`ebpo_verl.options.cli.options_table`) between ``<!-- options:NAME -->`` / ``<!-- /options:NAME -->``
markers; ``--check`` exits 1 naming a page whose table differs (``tests/test_knobs.py`` runs it)."""

from __future__ import annotations

import sys
from pathlib import Path

from ebpo_verl.evaluate.__main__ import GenerateOptions, GradeOptions
from ebpo_verl.evaluate.engines import EngineOptions
from ebpo_verl.ops.readme_block import check_or_write, replace_marked_block
from ebpo_verl.options.cli import OneLineParser, flag, options_table
from ebpo_verl.recipes.spec import RunSwitches
from ebpo_verl.recipes.switches import DriveSwitches, EvalSwitches, Modes

ROOT = Path(__file__).resolve().parents[1]
TABLES = {
    "evaluate-generate": ("docs/evaluation.md", lambda: options_table(GenerateOptions)),
    "evaluate-grade": ("docs/evaluation.md", lambda: options_table(GradeOptions)),
    "engine": ("docs/evaluation.md", lambda: options_table(EngineOptions)),
    "run-switches": ("docs/reproduction.md", lambda: options_table(RunSwitches, name=str, unset="unset")),
    "modes": ("docs/reproduction.md", lambda: options_table(Modes, name=str, unset="unset")),
    "drive-switches": ("docs/reproduction.md", lambda: options_table(DriveSwitches, name=str, unset="unset")),
    "eval-switches": ("docs/evaluation.md", lambda: options_table(EvalSwitches, name=str, unset="unset")),
}
"""Table name -> (the page it is in, its text)."""
COMMAND = "python -m ebpo_verl.docs_tables"


def updated(page: str, text: str) -> str:
    """``text`` (of ``page``) with each of its tables regenerated."""
    for name, (where, table) in TABLES.items():
        if where == page:
            text = replace_marked_block(text, f"<!-- options:{name} -->", f"<!-- /options:{name} -->", table())
    return text


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    parser.add_argument(flag("check"), action="store_true", help="exit 1 if a table differs; write nothing")
    parser.add_argument(flag("root"), type=Path, default=ROOT, help="the checkout whose docs/ to update")
    args = parser.parse_args(argv)
    status = 0
    for page in sorted({where for where, _ in TABLES.values()}):
        path = args.root / page
        text = path.read_text(encoding="utf-8")
        status |= check_or_write(path, text, updated(page, text), args.check, "option tables", COMMAND)
    return status


if __name__ == "__main__":
    sys.exit(main())
