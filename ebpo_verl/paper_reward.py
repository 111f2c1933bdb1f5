"""The authors' DAPO/Minerva grading rule, for training (``compute_score``) and evaluation (``grade_eval``).

docs/paper_notes.md#training-reward and #evaluation: the fork trained with verl's built-in DAPO math rule and
evaluated with a variant of it. Both look only at the last 300 characters of a response, find
``(?i)Answer\\s*:\\s*([^\\n]+)``, apply the Minerva answer normalisation (verl's
``math_dapo.normalize_final_answer``, reused here) to prediction and ground truth, and compare strings.
Neither falls back to ``\\boxed{}`` (verl 0.9.1's ``math_dapo.compute_score`` does, so it is not called).

* Training (``compute_score``): the LAST match is graded; +1 / -1; no match scores -1.
* Evaluation (``grade_eval``): with two or more matches the SECOND-TO-LAST is graded, and the normaliser
  drops a trailing ``.0`` right after keeping the text after the last ``=`` (so AMC23's ``27.0`` equals
  ``27``).
"""

from __future__ import annotations

import re
from typing import Any

from verl.utils.reward_score.math_dapo import is_correct_minerva, normalize_final_answer

from ebpo_verl.reward import missing_ground_truth

TAIL_CHARS = 300
"""Only this many trailing characters of a response are searched (as verl's and the fork's rule)."""
ANSWER_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
INVALID = "[INVALID]"
"""Prediction reported when the window has no ``Answer:`` line (the string verl's rule uses)."""


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> dict[str, Any]:
    """The paper's training reward (verl ``custom_reward_function`` signature): +1.0 when the last ``Answer:`` line
    matches ``ground_truth``, else -1.0 (also for a None, NaN or empty ground truth); ``{"score", "acc", "pred"}``."""
    correct, pred = is_correct_minerva(solution_str[-TAIL_CHARS:], str(ground_truth))
    if correct and _blank(ground_truth, normalize_final_answer):
        correct = False
    return {"score": 1.0 if correct else -1.0, "acc": bool(correct), "pred": pred}


def normalize_eval_answer(answer: str) -> str:
    """The evaluation normaliser: text after the last ``=``, a trailing ``.0`` dropped, then Minerva's rules."""
    return normalize_final_answer(answer.split("=")[-1].removesuffix(".0"))


def extract_eval_answer(response: str) -> str | None:
    """The raw answer the evaluation rule grades: the second-to-last ``Answer:`` match of the last 300
    characters when there are two or more, the only one when there is one, None when there is none."""
    matches = ANSWER_RE.findall(response[-TAIL_CHARS:])
    if not matches:
        return None
    return matches[-2] if len(matches) >= 2 else matches[0]


def _blank(ground_truth: Any, normalize: Any) -> bool:
    """Whether ``ground_truth`` is None, NaN or empty, as such or after ``normalize``: nothing can match it."""
    return missing_ground_truth(ground_truth) is not None or not normalize(str(ground_truth)).strip()


def grade_eval(response: str, ground_truth: Any) -> bool:
    """The paper's evaluation rule (docs/paper_notes.md#evaluation); False for a None, NaN or empty ground truth."""
    answer = extract_eval_answer(response)
    if answer is None or _blank(ground_truth, normalize_eval_answer):
        return False
    return normalize_eval_answer(answer) == normalize_eval_answer(str(ground_truth))
