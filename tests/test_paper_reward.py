"""The authors' DAPO/Minerva rule (docs/paper_notes.md): training reward (last match, +1/-1) and evaluation rule
(second-to-last match, trailing ``.0`` dropped), on hand-made responses with hand-worked expectations."""

from __future__ import annotations

import pytest
from verl.utils.reward_score import math_dapo

from ebpo_verl import paper_reward as P


def train(response: str, gt: str) -> float:
    return P.compute_score("math_dapo", response, gt)["score"]


def test_one_answer_line():
    text = "We compute 6 * 7.\nAnswer: 42"
    assert P.compute_score("aime2024", text, "42") == {"score": 1.0, "acc": True, "pred": "42"}
    assert P.compute_score("aime2024", text, "41") == {"score": -1.0, "acc": False, "pred": "42"}
    assert P.grade_eval(text, "42") is True
    assert P.grade_eval(text, "41") is False


def test_two_answer_lines_train_last_eval_second_to_last():
    text = "First try.\nAnswer: 7\nHmm, re-check.\nAnswer: 42"
    assert train(text, "42") == 1.0 and train(text, "7") == -1.0
    assert P.grade_eval(text, "7") is True and P.grade_eval(text, "42") is False
    three = "Answer: 1\nAnswer: 2\nAnswer: 3"
    assert P.extract_eval_answer(three) == "2"
    assert P.grade_eval(three, "2") and not P.grade_eval(three, "3") and not P.grade_eval(three, "1")


def test_case_insensitive_and_spacing():
    assert train("so ANSWER:   12", "12") == 1.0
    assert P.grade_eval("answer:12", "12")


def test_boxed_only_scores_minus_one_and_fails_eval():
    text = "The result is $\\boxed{42}$."
    assert P.compute_score("math_dapo", text, "42") == {"score": -1.0, "acc": False, "pred": P.INVALID}
    assert P.grade_eval(text, "42") is False
    # verl 0.9.1's own rule falls back to \boxed{} and would give +1: the paper's rule must not.
    assert math_dapo.compute_score(text, "42")["score"] == 1.0


def test_no_answer_at_all():
    assert train("I do not know.", "3") == -1.0
    assert P.extract_eval_answer("I do not know.") is None
    assert P.grade_eval("I do not know.", "3") is False


@pytest.mark.parametrize(
    ("answer", "gt"),
    [
        ("5 inches", "5"),  # unit removed
        ("10 degrees", "10"),
        ("1,000", "1000"),  # thousands separator dropped for an all-digit answer
        ("$1{,}000$", "1000"),
        ("$\\frac12$", "\\frac{1}{2}"),  # \fracab -> \frac{a}{b}
        ("x = 3", "3"),  # text after the last "="
        ("\\text{(A)}", "(A)"),
    ],
)
def test_minerva_normalisation_both_rules(answer, gt):
    text = f"work\nAnswer: {answer}"
    assert train(text, gt) == 1.0
    assert P.grade_eval(text, gt) is True


def test_trailing_point_zero_dropped_in_eval_only():
    assert train("Answer: 5.0", "5") == -1.0  # training compares "5.0" with "5"
    assert P.grade_eval("Answer: 5.0", "5") is True
    assert P.grade_eval("Answer: 27", "27.0") is True  # AMC23's stored float form
    assert P.grade_eval("Answer: x = 5.0", "5") is True  # dropped after the last "="
    assert P.grade_eval("Answer: 5.00", "5") is False  # only one trailing ".0"
    assert P.grade_eval("Answer: 5.05", "5") is False
    assert P.normalize_eval_answer("10.0") == "10"
    assert P.normalize_eval_answer("2.5") == "2.5"


def test_olympiad_multi_answer_ground_truth():
    # The paper's ground truth is the first element of final_answer, e.g. "$69$,$84$": Minerva's $...$ rule
    # keeps the first math span, so it normalises to "69".
    gt = "$69$,$84$"
    assert P.normalize_eval_answer(gt) == "69"
    assert P.grade_eval("Answer: $69$, $84$", gt) is True
    # "69, 84" -> "69,84" -> all digits without commas -> "6984": graded wrong, as the authors' rule does.
    assert P.grade_eval("Answer: 69, 84", gt) is False
    assert train("Answer: $69$, $84$", gt) == 1.0


def test_last_300_characters_window():
    head = "Answer: 42\n"
    assert len(head) == 11
    inside = head + "x" * (P.TAIL_CHARS - len(head))  # exactly 300 characters: the line is in the window
    outside = head + "x" * (P.TAIL_CHARS - len(head) + 1)  # the "A" falls out: "nswer: 42" does not match
    assert train(inside, "42") == 1.0 and P.grade_eval(inside, "42")
    assert train(outside, "42") == -1.0 and not P.grade_eval(outside, "42")
    # Two matches, the first outside the window: the eval rule sees only one and grades it.
    two = "Answer: 7\n" + "y" * 400 + "\nAnswer: 42"
    assert P.extract_eval_answer(two) == "42"
    assert P.grade_eval(two, "42")


def test_non_string_ground_truth():
    assert train("Answer: 33", 33) == 1.0
    assert P.grade_eval("Answer: 33", 33)


def test_long_response_grades_fast():
    import time

    text = ("step " * 4000) + "\nAnswer: 12"  # 20k characters
    t0 = time.perf_counter()
    for _ in range(1000):
        P.grade_eval(text, "12")
        P.compute_score("math_dapo", text, "12")
    assert time.perf_counter() - t0 < 5.0
