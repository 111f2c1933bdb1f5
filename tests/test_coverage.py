"""pass@k, maj@k and avg@n: the pure math against values worked out by hand, the protocols' answer classes, and
crafted generations files graded end to end (all right, all wrong, one right of n, k = n, a majority tie,
unequal n across benchmarks)."""

from __future__ import annotations

import math

import pytest

from ebpo_verl.data.all import prepare_all
from ebpo_verl.evaluate.answers import answer_classes
from ebpo_verl.evaluate.coverage import benchmark_coverage, block_vote, ks_for, maj_at_k, pass_at_k
from ebpo_verl.evaluate.generations import GenerationsFile
from ebpo_verl.evaluate.grading import grade_file
from ebpo_verl.evaluate.prompts import load_problems


def mean_se(values: list[float]) -> tuple[float, float]:
    """100 x (mean, sample sd / sqrt(P)), written out."""
    p = len(values)
    mean = sum(values) / p
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (p - 1))
    return 100 * mean, 100 * sd / math.sqrt(p)


def test_ks():
    assert ks_for(16) == [1, 2, 4, 8, 16]
    assert ks_for(4) == [1, 2, 4]
    assert ks_for(1) == [1]
    assert ks_for(3) == [1, 2, 3]  # n itself even when not a power of two
    assert ks_for(12) == [1, 2, 4, 8, 12]


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 4, 1) == 1.0 and pass_at_k(4, 4, 4) == 1.0  # all right
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 0, 4) == 0.0  # all wrong
    # one right of 4: a draw of k includes it with probability k/4 (1 of C(4,1); 3 of the 6 pairs; always at k = n)
    assert [pass_at_k(4, 1, k) for k in (1, 2, 3, 4)] == [0.25, 0.5, 0.75, 1.0]
    # 2 right of 16, k = 8: 1 - C(14, 8) / C(16, 8) = 1 - 3003 / 12870
    assert pass_at_k(16, 2, 8) == pytest.approx(1 - 3003 / 12870)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)


def test_majority_vote_and_its_tie_rule_by_hand():
    correct = {0: True, 1: False, 2: False}
    assert block_vote([0, 0, 1], correct) == 1.0
    assert block_vote([1, 0, 1, None, None, None], correct) == 0.0  # no-answers do not vote
    assert block_vote([0, 1], correct) == 0.5  # a tie of one right and one wrong class: half
    assert block_vote([0, 1, 2], correct) == pytest.approx(1 / 3)
    assert block_vote([1, 2], correct) == 0.0
    assert block_vote([None, None], correct) == 0.0  # nobody answered
    # classes A(right) B B A: k=1 -> 1,0,0,1; k=2 blocks [A,B] [B,A] -> ties 1/2, 1/2; k=4 -> 2:2 tie -> 1/2
    samples = [(0, True), (1, False), (1, False), (0, True)]
    assert [maj_at_k(samples, k) for k in (1, 2, 4)] == [0.5, 0.5, 0.5]
    # n = 3, k = 2: one block (samples 0 and 1), sample 2 unused
    assert maj_at_k([(0, False), (0, False), (1, True)], 2) == 0.0
    # a class's verdict is its first sample's
    assert maj_at_k([(0, True), (0, False), (1, False)], 3) == 1.0


def test_benchmark_coverage_by_hand():
    problems = [
        [(0, True)] * 4,  # all right
        [(0, False), (1, False), (None, False), (0, False)],  # all wrong
        [(0, False), (1, True), (2, False), (0, False)],  # one right of 4
    ]
    got = benchmark_coverage(problems)
    assert got["n"] == 4 and list(got["pass@k"]) == ["1", "2", "4"]
    want = {
        ("pass@k", "1"): [1, 0, 0.25],
        ("pass@k", "2"): [1, 0, 0.5],
        ("pass@k", "4"): [1, 0, 1],  # k = n: any right sample
        ("maj@k", "1"): [1, 0, 0.25],
        ("maj@k", "2"): [1, 0, (0.5 + 0) / 2],  # blocks [A, R] (tie) and [B, A]
        ("maj@k", "4"): [1, 0, 0],  # A has two votes
    }
    for (name, k), values in want.items():
        mean, se = mean_se(values)
        assert got[name][k] == pytest.approx(mean), (name, k)
        assert got[f"{name}_stderr"][k] == pytest.approx(se), (name, k)
    assert (got["avg@n"], got["avg@n_stderr"]) == pytest.approx(mean_se([1, 0, 0.25]))
    with pytest.raises(ValueError, match="same number of samples"):
        benchmark_coverage([[(0, True)], [(0, True), (0, True)]])


def test_answer_classes_follow_each_protocols_equivalence():
    responses = ["Answer: 12", "Answer: 012", "Answer: 204", "Answer: 204", "no answer here", "Answer: $12$"]
    # paper: normalised strings ("012" is not "12"; the dollars are stripped)
    assert answer_classes("paper", [responses]) == [[0, 1, 2, 2, None, 0]]
    # verl: math-verify's equality (012 == 12), the same extracted text, \boxed{} as well as Answer:
    assert answer_classes("verl", [responses]) == [[0, 0, 1, 1, None, 0]]
    fractions = ["\\boxed{\\frac{1}{2}}", "\\boxed{0.5}", "Answer: 1/2", "\\boxed{3}"]
    assert answer_classes("verl", [fractions]) == [[0, 0, 0, 1]]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, hub_data):
    out = tmp_path_factory.mktemp("data")
    prepare_all(out, hub_data, "dapo", False, ("aime2024", "olympiadbench"))
    return out


def _write(path, protocol: str, runs: dict[str, int], lines: list[tuple[str, int, int, str]]) -> None:
    meta = {"protocol": protocol, "model": "m", "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 10}
    problems = {b: 1 + max(i for bb, i, _, _ in lines if bb == b) for b in runs}
    meta["benchmarks"] = {b: {"runs": r, "limit": problems[b], "problems": problems[b]} for b, r in runs.items()}
    records = [
        {"benchmark": b, "index": i, "sample": s, "response": text, "response_tokens": 1, "finish_reason": "stop"}
        for b, i, s, text in lines
    ]
    with GenerationsFile(path, meta) as gen:
        gen.append(records)


def test_crafted_generations_graded_with_unequal_n(data_dir, tmp_path):
    """aime2024: 3 problems x 4 runs (all right, all wrong, one right); olympiadbench: 2 problems x 2 runs."""
    aime = [p.ground_truth for p in load_problems(data_dir, "aime2024", "paper", limit=3)]
    oly = [p.ground_truth for p in load_problems(data_dir, "olympiadbench", "paper", limit=2)]
    texts = {
        0: [f"Answer: {aime[0]}"] * 4,
        1: ["Answer: 1000", "Answer: 1001", "no answer", "Answer: 1000"],
        2: ["Answer: 999", f"Answer: {aime[2]}", "Answer: 998", "Answer: 999"],
    }
    lines = [("aime2024", i, s, t) for i, ts in texts.items() for s, t in enumerate(ts)]
    lines += [("olympiadbench", 0, s, f"Answer: {oly[0]}") for s in range(2)]
    lines += [("olympiadbench", 1, 0, "Answer: 123456789"), ("olympiadbench", 1, 1, f"Answer: {oly[1]}")]
    path = tmp_path / "gen.jsonl"
    _write(path, "paper", {"aime2024": 4, "olympiadbench": 2}, lines)
    res = grade_file("paper", path, data_dir)
    a, o = res["benchmarks"]["aime2024"], res["benchmarks"]["olympiadbench"]
    assert a["pass@1"] == pytest.approx(100 * (1 + 0 + 0.25) / 3) and a["pass@1_stderr"] is not None  # kept
    assert (a["n"], o["n"]) == (4, 2)
    hand = {
        "aime2024": {"pass@k": {"1": [1, 0, 0.25], "2": [1, 0, 0.5], "4": [1, 0, 1]},
                     "maj@k": {"1": [1, 0, 0.25], "2": [1, 0, 0.25], "4": [1, 0, 0]}},
        "olympiadbench": {"pass@k": {"1": [1, 0.5], "2": [1, 1]}, "maj@k": {"1": [1, 0.5], "2": [1, 0.5]}},
    }  # fmt: skip
    for bench, metrics in hand.items():
        for name, by_k in metrics.items():
            got = res["benchmarks"][bench]
            assert list(got[name]) == list(by_k)
            for k, values in by_k.items():
                assert (got[name][k], got[f"{name}_stderr"][k]) == pytest.approx(mean_se(values)), (bench, name, k)
    assert o["avg@n"] == pytest.approx(75.0) and a["avg@n"] == pytest.approx(a["pass@1"])
    # the average only over the k both benchmarks have: 1 and 2, not 4
    assert res["average_pass@k"] == pytest.approx({"1": (a["pass@k"]["1"] + 75) / 2, "2": (50 + 100) / 2})
    assert res["average_maj@k"] == pytest.approx({"1": (a["maj@k"]["1"] + 75) / 2, "2": (100 / 3 * 1.25 + 75) / 2})


def test_crafted_generations_verl_protocol_and_partial(data_dir, tmp_path):
    """verl: 012 and 12 vote together (math-verify), so maj@4 ties 2:2 (= 1/2) where the paper rule gives the
    right answer the majority; an incomplete benchmark reports no coverage."""
    gt = load_problems(data_dir, "aime2024", "verl", limit=1)[0].ground_truth
    texts = ["Answer: 12", "Answer: 012", f"Answer: {gt}", f"\\boxed{{{gt}}}"]
    path = tmp_path / "verl.jsonl"
    _write(path, "verl", {"aime2024": 4}, [("aime2024", 0, s, t) for s, t in enumerate(texts)])
    got = grade_file("verl", path, data_dir)["benchmarks"]["aime2024"]
    assert got["pass@k"] == {"1": 50.0, "2": pytest.approx(100 * (1 - 1 / 6)), "4": 100.0}
    assert got["maj@k"] == {"1": 50.0, "2": 50.0, "4": 50.0}  # blocks [12, 012] -> 0, [gt, gt] -> 1; 2:2 tie
    ppath = tmp_path / "paper.jsonl"
    paper_texts = texts[:3] + [f"Answer: {gt}"]
    _write(ppath, "paper", {"aime2024": 4}, [("aime2024", 0, s, t) for s, t in enumerate(paper_texts)])
    assert grade_file("paper", ppath, data_dir)["benchmarks"]["aime2024"]["maj@k"]["4"] == 100.0
    part = tmp_path / "part.jsonl"
    _write(part, "paper", {"aime2024": 4}, [("aime2024", 0, s, t) for s, t in enumerate(paper_texts[:3])])
    res = grade_file("paper", part, data_dir, allow_partial=True)
    b = res["benchmarks"]["aime2024"]
    assert b["complete"] is False and b["pass@k"] is None and b["maj@k"] is None and b["avg@n"] is None
    assert res["average_pass@k"] == {} and b["pass@1"] == pytest.approx(100 / 3)  # runs: 0, 0, 1
