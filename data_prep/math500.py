"""MATH-500 (Lightman et al.'s 500-problem subset of the MATH test split), an evaluation set.

``answer`` is the reference; ``extra_info.topic`` is ``subject`` and ``extra_info.difficulty`` the level.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_prep.math_train import parse_level
from data_prep.schema import Example, cli, finish, load_source, pick, require_text

NAME = "math500"
HUB_ID, HUB_CONFIG, HUB_SPLIT = "HuggingFaceH4/MATH-500", None, "test"


def convert(row: dict[str, Any], i: int) -> Example:
    subject = pick(row, ("subject", "type"))
    source_id = pick(row, ("unique_id", "id"))
    return Example(
        problem=require_text(row, ("problem", "question")),
        answer=require_text(row, ("answer",)),
        source_id=str(i if source_id is None else source_id),
        topic=None if subject is None else str(subject),
        difficulty=parse_level(pick(row, ("level",))),
    )


def prepare(
    out_dir: str | Path,
    local_path: str | Path | None = None,
    template: str = "dapo",
    skip_invalid: bool = False,
    revision: str | None = None,
) -> Path:
    """Write ``out_dir/math500.parquet`` from MATH-500 (hub or ``local_path``)."""
    df = load_source(local_path, HUB_ID, HUB_SPLIT, HUB_CONFIG, revision)
    return finish(NAME, out_dir, df, convert, "test", template, skip_invalid, str(local_path or HUB_ID))


def main(argv: list[str] | None = None) -> Path:
    return cli(NAME, prepare, argv)


if __name__ == "__main__":
    main()
