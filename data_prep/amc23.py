"""AMC 2023 (40 problems), an evaluation set.

The public copies write answers as floats (``"27.0"``); an integral value is stored as ``"27"``, any other
answer verbatim. The hub copy names the text column ``question``, local copies ``problem``: both work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_prep.schema import Example, cli, finish, load_source, pick, require_text

NAME = "amc23"
HUB_ID, HUB_CONFIG, HUB_SPLIT = "math-ai/amc23", None, "test"


def canonical_number(text: str) -> str:
    """``"27.0"`` -> ``"27"``; non-integral or non-numeric answers unchanged."""
    try:
        value = float(text)
    except ValueError:
        return text
    return str(int(value)) if value.is_integer() else text


def convert(row: dict[str, Any], i: int) -> Example:
    source_id = pick(row, ("id", "unique_id"))
    return Example(
        problem=require_text(row, ("problem", "question"), field="problem"),
        answer=canonical_number(require_text(row, ("answer",))),
        source_id=str(i if source_id is None else source_id),
    )


def prepare(
    out_dir: str | Path,
    local_path: str | Path | None = None,
    template: str = "dapo",
    skip_invalid: bool = False,
    revision: str | None = None,
) -> Path:
    """Write ``out_dir/amc23.parquet`` from AMC 2023 (hub or ``local_path``)."""
    df = load_source(local_path, HUB_ID, HUB_SPLIT, HUB_CONFIG, revision)
    return finish(NAME, out_dir, df, convert, "test", template, skip_invalid, str(local_path or HUB_ID))


def main(argv: list[str] | None = None) -> Path:
    return cli(NAME, prepare, argv)


if __name__ == "__main__":
    main()
