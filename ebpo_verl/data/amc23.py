"""AMC 2023 (40 problems), an evaluation set.

The public copies write answers as floats (``"27.0"``); an integral value is stored as ``"27"``, any other
answer verbatim. The hub copy names the text column ``question``, local copies ``problem``: both work.
"""

from __future__ import annotations

from typing import Any

from ebpo_verl.data.schema import Dataset, Example, require_text, source_id, verbatim


def canonical_number(text: str) -> str:
    """``"27.0"`` -> ``"27"``; non-integral or non-numeric answers unchanged."""
    try:
        value = float(text)
    except ValueError:
        return text
    return str(int(value)) if value.is_integer() else text


def convert(row: dict[str, Any], i: int) -> Example:
    return Example(
        problem=require_text(row, ("problem", "question"), field="problem"),
        answer=canonical_number(require_text(row, ("answer",), numbers=True)),
        source_id=source_id(row, ("id", "unique_id"), i),
        **verbatim(row, ("problem", "question"), ("answer",)),
    )


DATASET = Dataset("amc23", "math-ai/amc23", "test", convert, split="test")
prepare = DATASET.prepare
main = DATASET.main


if __name__ == "__main__":
    main()
