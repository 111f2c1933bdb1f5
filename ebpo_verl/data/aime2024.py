"""AIME 2024 (I and II, 30 problems), an evaluation set.

Answers are integers 0-999; copies that zero-pad them as strings (``"025"``) are normalised to ``"25"``.
Accepts the ``Maxwell-Jia/AIME_2024`` schema (``ID, Problem, Answer``) and the ``HuggingFaceH4/aime_2024``
one (``id, problem, answer``).
"""

from __future__ import annotations

from typing import Any

from ebpo_verl.data.schema import Dataset, Example, InvalidRowError, require_text, source_id, verbatim


def aime_answer(row: dict[str, Any]) -> str:
    """The integer answer as a canonical string (``"025"`` -> ``"25"``); invalid unless 0-999."""
    text = require_text(row, ("answer", "Answer"), field="answer", numbers=True)
    try:
        value = float(text)
    except ValueError:
        raise InvalidRowError("answer", f"{text!r} is not an integer (AIME answers are 0-999)") from None
    if not value.is_integer() or not 0 <= value <= 999:
        raise InvalidRowError("answer", f"{text!r} is not an integer in 0-999")
    return str(int(value))


def aime_example(row: dict[str, Any], i: int) -> Example:
    """An AIME row in any of the common hub schemas."""
    return Example(
        problem=require_text(row, ("problem", "Problem", "question"), field="problem"),
        answer=aime_answer(row),
        source_id=source_id(row, ("ID", "id", "problem_idx", "url"), i),
        **verbatim(row, ("problem", "Problem", "question"), ("answer", "Answer")),
    )


DATASET = Dataset("aime2024", "Maxwell-Jia/AIME_2024", "train", aime_example, split="test")
prepare = DATASET.prepare
main = DATASET.main


if __name__ == "__main__":
    main()
