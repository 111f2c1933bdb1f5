"""MATH train split (Hendrycks et al., 7,500 problems) with its subject and level labels.

Answer = the content of the last balanced ``\\boxed{}`` of ``solution`` (braces nest). ``extra_info.topic``
is the ``type`` column (7 subjects), ``extra_info.difficulty`` the integer level 1-5. Two rows of the
public copy say ``"Level ?"``: their difficulty is left as None rather than guessed.
"""

from __future__ import annotations

import re
from typing import Any

from ebpo_verl.data.schema import Dataset, Example, InvalidRowError, optional_text, pick, require_text
from ebpo_verl.reward import last_boxed

NAME = "math_train"
_LEVEL_RE = re.compile(r"^\s*(?:Level\s+)?([1-5])\s*$")


def parse_level(level: Any) -> int | None:
    """``"Level 3"`` or ``3`` -> 3; ``"Level ?"`` or a missing level -> None; anything else is invalid."""
    if level is None or str(level).strip() in ("", "Level ?"):
        return None
    m = _LEVEL_RE.match(str(level))
    if m is None:
        raise InvalidRowError("level", f"unparseable level {level!r} (expected 'Level 1'..'Level 5')")
    return int(m.group(1))


def convert(row: dict[str, Any], i: int) -> Example:
    problem = require_text(row, ("problem",))
    solution = require_text(row, ("solution",))
    answer = last_boxed(solution)
    if answer is None or not answer.strip():
        raise InvalidRowError("solution", "no balanced \\boxed{...} answer in the solution")
    return Example(
        problem=problem,
        answer=answer.strip(),
        source_id=str(i),
        topic=optional_text(row, ("type",), "type"),
        difficulty=parse_level(pick(row, ("level",))),
    )


DATASET = Dataset(NAME, "DigitalLearningGmbH/MATH-lighteval", "train", convert, split="train", hub_config="default")
prepare = DATASET.prepare
main = DATASET.main


if __name__ == "__main__":
    main()
