"""Faults and bad input on the evaluation and data side (issue 22): each test reproduces one finding.

Finding 5: a ground truth that is empty, None or NaN never scores 1 and is refused where data enters.
"""

from __future__ import annotations

import math

import pandas as pd
import pyarrow as pa
import pytest

from data_prep.schema import DataPrepError, check_ground_truths
from ebpo_verl import paper_reward
from ebpo_verl import reward as verl_reward

EMPTY_ANSWERS = ["Answer: ", "Answer: $$", "Answer: \\boxed{}", "\\boxed{}", "Answer: {}"]
NONE_ANSWERS = ["Answer: None", "Answer: nan", "Answer: NaN", "\\boxed{None}", "\\boxed{nan}"]


def _scores(response: str, truth: object) -> tuple[float, float, bool]:
    """(training reward of REWARD=paper, of REWARD=verl (math-verify), paper evaluation verdict)."""
    return (
        paper_reward.compute_score("aime2024", response, truth)["score"],
        verl_reward.compute_score("aime2024", response, truth)["score"],
        paper_reward.grade_eval(response, truth),
    )


@pytest.mark.parametrize("response", EMPTY_ANSWERS)
@pytest.mark.parametrize("truth", ["", "  ", "$$", "\\boxed{}"])
def test_empty_answer_never_matches_an_empty_ground_truth(response, truth):
    assert _scores(response, truth) == (-1.0, 0.0, False)


@pytest.mark.parametrize("response", NONE_ANSWERS + EMPTY_ANSWERS)
@pytest.mark.parametrize("truth", [None, float("nan"), math.nan])
def test_none_or_nan_ground_truth_scores_nothing(response, truth):
    assert _scores(response, truth) == (-1.0, 0.0, False)


def test_real_answers_still_score():
    assert _scores("so\nAnswer: 42", "42") == (1.0, 1.0, True)
    assert _scores("Answer: 0", "0") == (1.0, 1.0, True)  # "0" is an answer, not an empty one
    assert _scores("Answer: 0", 0) == (1.0, 1.0, True)


def test_missing_ground_truth_reasons():
    m = verl_reward.missing_ground_truth
    assert [m(v) for v in (None, float("nan"), "", " $ $ ", "\\boxed{ }", "{}")] == [
        "None",
        "NaN",
        "empty",
        "empty",
        "empty",
        "empty",
    ]
    assert [m(v) for v in ("0", 0, 0.0, "None of these", "\\boxed{3}", False)] == [None] * 6


def _rows(truths: list[object]) -> list[dict]:
    return [{"reward_model": {"ground_truth": t, "style": "rule"}} for t in truths]


def test_check_ground_truths_names_the_rows_of_a_table_and_a_frame():
    truths = ["1", "", "2", None, "3"]
    table = pa.Table.from_pylist(_rows(truths))
    with pytest.raises(DataPrepError, match=r"^train\.parquet: .* in 2 row\(s\), 0-based: 1 \(empty\), 3 \(None\);"):
        check_ground_truths(table, "train.parquet")
    frame = pd.DataFrame({"reward_model": [{"ground_truth": float("nan")}, {"ground_truth": "4"}, {"style": "x"}]})
    with pytest.raises(DataPrepError, match=r"0 \(NaN\), 2 \(no ground_truth key\)"):
        check_ground_truths(frame, "val.parquet")
    with pytest.raises(DataPrepError, match="no reward_model column"):
        check_ground_truths(pd.DataFrame({"x": [1]}), "val.parquet")
    check_ground_truths(pa.Table.from_pylist(_rows(["1", "0"])), "ok.parquet")  # no error
