"""OlympiadBench, text-only English open-ended competition maths (``OE_TO_maths_en_COMP``, 674 problems).

``final_answer`` is a list (usually one ``$...$``-wrapped string; ``is_multiple_answer`` rows hold several
parts such as ``$69$,$84$``): the ground truth is its elements with the ``$`` delimiters removed, joined by
", ". ``extra_info.topic`` is ``subfield``. A row's ``unit`` (9 rows) is stated after the problem, as the
benchmark's own prompt does. Relay problems whose ``T`` was never substituted (``T=TNYWR`` in the original
675-row release) are invalid rows: they cannot be answered.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ebpo_verl.data.schema import (
    Dataset,
    Example,
    InvalidRowError,
    as_text,
    optional_text,
    pick,
    require_text,
    source_id,
)

NAME = "olympiadbench"
_DOLLAR_RE = re.compile(r"(?<!\\)\$")
_TNYWR_RE = re.compile(r"T\s*=\s*T\s*N\s*Y\s*W\s*R")


def join_final_answer(final_answer: Any) -> str:
    """``["$69$,$84$"]`` -> ``"69,84"``; several list elements are joined by ", "."""
    if isinstance(final_answer, str):
        parts = [final_answer]
    elif isinstance(final_answer, list | tuple | np.ndarray):
        parts = [as_text(p, "final_answer", numbers=True) for p in final_answer if p is not None]
    else:
        raise InvalidRowError("final_answer", f"expected a list of strings, got {type(final_answer).__name__}")
    parts = [bare for p in parts if (bare := _DOLLAR_RE.sub("", p).strip())]
    if not parts:
        raise InvalidRowError("final_answer", "empty")
    return ", ".join(parts)


def first_answer(final_answer: Any) -> str:
    """The first element of ``final_answer`` as stored (``$``-wrapped): the paper's evaluation ground truth."""
    first = (
        final_answer[0] if isinstance(final_answer, list | tuple | np.ndarray) and len(final_answer) else final_answer
    )
    return as_text(first, "final_answer", numbers=True)


def convert(row: dict[str, Any], i: int) -> Example:
    question = require_text(row, ("question", "problem"))
    if _TNYWR_RE.search(question):
        raise InvalidRowError("question", "relay problem with an unresolved T (TNYWR): not answerable alone")
    context = optional_text(row, ("context",), "context")
    problem = f"{context}\n\n{question}" if context else question
    if unit := optional_text(row, ("unit",), "unit"):
        problem += f"\n\nThe unit of the answer is {unit}."
    answer = pick(row, ("final_answer", "answer"))
    if answer is None:
        raise InvalidRowError("final_answer", "missing", columns=("final_answer", "answer"))
    return Example(
        problem=problem,
        answer=join_final_answer(answer),
        source_id=source_id(row, ("id",), i),
        topic=optional_text(row, ("subfield",), "subfield"),
        raw_problem=str(pick(row, ("question", "problem"))),
        raw_answer=first_answer(answer),
    )


DATASET = Dataset(NAME, "Hothan/OlympiadBench", "train", convert, split="test", hub_config="OE_TO_maths_en_COMP")
prepare = DATASET.prepare
main = DATASET.main


if __name__ == "__main__":
    main()
