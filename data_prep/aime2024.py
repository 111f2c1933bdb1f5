"""AIME 2024 (I and II, 30 problems), an evaluation set.

Answers are integers 0-999; copies that zero-pad them as strings (``"025"``) are normalised to ``"25"``.
Accepts the ``Maxwell-Jia/AIME_2024`` schema (``ID, Problem, Answer``) and the ``HuggingFaceH4/aime_2024``
one (``id, problem, answer``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_prep.schema import Example, InvalidRowError, cli, finish, load_source, pick, require_text

NAME = "aime2024"
HUB_ID, HUB_CONFIG, HUB_SPLIT = "Maxwell-Jia/AIME_2024", None, "train"


def aime_answer(row: dict[str, Any]) -> str:
    """The integer answer as a canonical string (``"025"`` -> ``"25"``); invalid unless 0-999."""
    text = require_text(row, ("answer", "Answer"), field="answer")
    try:
        value = float(text)
    except ValueError:
        raise InvalidRowError("answer", f"{text!r} is not an integer (AIME answers are 0-999)") from None
    if not value.is_integer() or not 0 <= value <= 999:
        raise InvalidRowError("answer", f"{text!r} is not an integer in 0-999")
    return str(int(value))


def aime_example(row: dict[str, Any], i: int) -> Example:
    """An AIME row in any of the common hub schemas."""
    source_id = pick(row, ("ID", "id", "problem_idx", "url"))
    return Example(
        problem=require_text(row, ("problem", "Problem", "question"), field="problem"),
        answer=aime_answer(row),
        source_id=str(i if source_id is None else source_id),
    )


def prepare(
    out_dir: str | Path,
    local_path: str | Path | None = None,
    template: str = "dapo",
    skip_invalid: bool = False,
    revision: str | None = None,
) -> Path:
    """Write ``out_dir/aime2024.parquet`` from AIME 2024 (hub or ``local_path``)."""
    df = load_source(local_path, HUB_ID, HUB_SPLIT, HUB_CONFIG, revision)
    return finish(NAME, out_dir, df, aime_example, "test", template, skip_invalid, str(local_path or HUB_ID))


def main(argv: list[str] | None = None) -> Path:
    return cli(NAME, prepare, argv)


if __name__ == "__main__":
    main()
