"""MATH-500 (Lightman et al.'s 500-problem subset of the MATH test split), an evaluation set.

``answer`` is the reference; ``extra_info.topic`` is ``subject`` and ``extra_info.difficulty`` the level.
"""

from __future__ import annotations

from typing import Any

from ebpo_verl.data.math_train import parse_level
from ebpo_verl.data.schema import Dataset, Example, optional_text, pick, require_text, source_id, verbatim


def convert(row: dict[str, Any], i: int) -> Example:
    return Example(
        problem=require_text(row, ("problem", "question")),
        answer=require_text(row, ("answer",), numbers=True),
        source_id=source_id(row, ("unique_id", "id"), i),
        topic=optional_text(row, ("subject", "type"), "subject"),
        difficulty=parse_level(pick(row, ("level",))),
        **verbatim(row, ("problem", "question"), ("answer",)),
    )


DATASET = Dataset("math500", "HuggingFaceH4/MATH-500", "test", convert, split="test")
prepare = DATASET.prepare
main = DATASET.main


if __name__ == "__main__":
    main()
