"""The math-verify reward: extraction, equivalence, the time bound, thread safety, and the acceptance run
over every row of every source file (``hub_data``: ../shared/data, or on a clone without it the made-up rows of
tests/fixtures/hub): own answer scores 1, another row's answer scores 0."""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

from ebpo_verl import reward as R

BOUND_S = 2.0


@pytest.fixture(scope="module", autouse=True)
def warm_pool():
    R.warm_up(R.MAX_WORKERS)


# ---------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("So x = 3.\nAnswer: 42", "42"),
        ("Answer: 1\nwait, no.\nAnswer: $\\frac{3}{4}$.", "\\frac{3}{4}"),
        ("**Answer:** 7", "7"),
        ("answer:\n\n  (2, 3)  \n", "(2, 3)"),
        ("Answer: the value is \\boxed{12}", "12"),
        ("thus $\\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt{3}}{2}"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\boxed{5}}", "\\boxed{5}"),
        ("first \\boxed{9} then truncated \\boxed{3", "9"),
        ("our answer is $\\boxed 2$.", "2"),
        ("no final answer here", None),
        # the answer stated LAST wins, whichever form it takes; "answer:" inside a sentence is reasoning
        ("let me check the answer: 5 is wrong.\nSo $\\boxed{7}$", "7"),
        ("\\boxed{6}\nAnswer: 7", "7"),
        ("Answer: 5\nwait, that is wrong: $\\boxed{6}$", "6"),
        ("we get our answer: \\[\n1^{55} = \\boxed{1}.\\]", "1"),
        ("$\\boxed{44}$.\n\nWe may check our answer: $17 \\cdot 44 = 748$, so it is right.", "44"),
        ("**Final Answer:** $42$", "42"),
        ("Answer: **12**.", "12"),  # bold, then the sentence's full stop
        ("Answer: **$\\frac{1}{2}$**.", "\\frac{1}{2}"),
        ("Answer: **3.5**", "3.5"),
        ("## Final answer: 3", "3"),
        ("> The final answer: 9", "9"),
        ("Answer:\n\\[ 42 \\]", "42"),
        ("So the answer: 12", "12"),  # neither form: the last "answer:" anywhere
    ],
)
def test_extract_answer(text, expected):
    assert R.extract_answer(text) == expected


def test_last_boxed_handles_deep_nesting_linearly():
    depth = 10_000
    text = "\\boxed{" + "{" * depth + "x" + "}" * depth + "}"
    t0 = time.monotonic()
    assert R.last_boxed(text) == "{" * depth + "x" + "}" * depth
    assert R.last_boxed("\\boxed{" * 200_000) is None  # 1.4 MB of unclosed boxes
    assert time.monotonic() - t0 < 2.0


# ---------------------------------------------------------------- equivalence


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("27", "27.0"),
        ("27.0", "27"),
        ("25", "025"),
        ("\\frac{1}{2}", "0.5"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
        ("69, 84", "84, 69"),
        ("(1,8,19), (2,7,13), (4,5,7)", "(2,7,13),(1,8,19),(4,5,7)"),
        ("[1,2)", "[1, 2)"),
        ("45", "45 \\text{ minutes}"),
        ("4.2", "4.2\\%"),
        ("44", "44^\\circ"),
        ("\\text{Evelyn}", "Evelyn"),
        ("x^2+2x+1", "(x+1)^2"),
        ("2\\sqrt{2}", "\\sqrt{8}"),
        ("\\frac{1}{2}", "\\dfrac12"),
        ("\\frac{3}{4}", "\\frac3{4}"),
        ("3\\sqrt{2}", "3\\sqrt2"),
    ],
)
def test_equivalent_answers_score_one(gold, pred):
    for response in (f"Reasoning...\nAnswer: {pred}", f"Therefore the answer is $\\boxed{{{pred}}}$."):
        out = R.compute_score("test", response, gold)
        assert out == {"score": 1.0, "acc": True, "pred": pred}, (gold, response, out)


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("27", "28"),
        ("\\frac{1}{2}", "\\frac{1}{3}"),
        ("(1, 2)", "(2, 1)"),
        ("[1,2)", "(1,2]"),
        ("\\sqrt{2}", "1.414"),
        ("x^2+2x+1", "(x-1)^2"),
        ("\\text{Evelyn}", "Devon"),
        ("5", ""),
    ],
)
def test_wrong_answers_score_zero(gold, pred):
    out = R.compute_score("test", f"Answer: {pred}", gold)
    assert out["score"] == 0.0 and out["acc"] is False


def test_missing_answer_scores_zero_with_empty_pred():
    assert R.compute_score("aime2024", "I could not solve it.", "33") == {"score": 0.0, "acc": False, "pred": ""}


# ---------------------------------------------------------------- time bound and threads


ADVERSARIAL = {
    "1MB answer": "Answer: " + "9" * 1_000_000 + "x",
    "10k nested braces": "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
    "power tower": "Answer: 10^{10^{10^{10}}}",
    "power tower boxed": "$\\boxed{10^{10^{10^{10}}}}$",
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
@pytest.mark.parametrize("max_chars", [R.MAX_ANSWER_CHARS, 10**7])
def test_adversarial_answer_scores_zero_within_bound(name, max_chars):
    """With the length cap (pre-screen) and without it (the child is killed at the bound). The bound is on
    the grading itself: wait until the pool's children (replacements of killed ones) have started."""
    R.warm_up(R.MAX_WORKERS)
    t0 = time.monotonic()
    out = R.compute_score("test", ADVERSARIAL[name], "1", timeout=BOUND_S, max_answer_chars=max_chars)
    elapsed = time.monotonic() - t0
    assert out["score"] == 0.0 and out["acc"] is False
    assert elapsed < BOUND_S + 1.0, f"{name}: {elapsed:.2f}s"


def test_pool_recovers_after_a_kill():
    R.compute_score("test", ADVERSARIAL["power tower"], "1", timeout=0.5)
    assert R.compute_score("test", "Answer: \\frac{2}{4}", "\\frac{1}{2}", timeout=BOUND_S + 60)["score"] == 1.0


def test_called_from_threads_like_verl():
    """verl calls compute_score via loop.run_in_executor (a worker thread); math-verify's signal.alarm
    cannot run there, so this fails without the process pool. A pathological call must not block others."""
    results: dict[str, dict] = {}

    def call(key, response, gold):
        results[key] = R.compute_score("test", response, gold, timeout=BOUND_S)

    threads = [threading.Thread(target=call, args=("tower", ADVERSARIAL["power tower"], "1"))]
    threads += [
        threading.Thread(target=call, args=(f"ok{i}", f"Answer: \\frac{{{i}}}{{{2 * i}}}", "0.5")) for i in (1, 2, 3)
    ]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert time.monotonic() - t0 < BOUND_S + 60  # ok-calls may wait for a worker start, never hang
    assert results["tower"]["score"] == 0.0
    assert [results[f"ok{i}"]["score"] for i in (1, 2, 3)] == [1.0, 1.0, 1.0]

    async def via_executor():
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: R.compute_score("aime2024", "Answer: $033$", "33"))

    assert asyncio.run(via_executor())["score"] == 1.0


# ---------------------------------------------------------------- acceptance on the real files


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _last_boxed_simple(s: str) -> str:
    """Independent extraction of MATH's answer for the test: brace counting from the last \\boxed."""
    i = s.rfind("\\boxed")
    j = i + len("\\boxed")
    while s[j] == " ":
        j += 1
    if s[j] != "{":  # "\boxed 2$" form
        return s[j:].split("$")[0].split()[0]
    depth, k = 0, j
    while True:
        depth += {"{": 1, "}": -1}.get(s[k], 0)
        if depth == 0:
            return s[j + 1 : k]
        k += 1


def _raw_cases(folder: Path) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """file -> (dataset module, [(source_id, answer as written in the file)])."""
    v = folder / "variants"

    def ob(p):
        return [(str(r["id"]), ",".join(r["final_answer"])) for r in _jsonl(p)]

    def dapo(p):
        return [(str(r["extra_info"]["index"]), r["reward_model"]["ground_truth"]) for r in _jsonl(p)]

    math_rows = _jsonl(folder / "math_train.jsonl")
    return {
        "math500.jsonl": ("math500", [(r["unique_id"], r["answer"]) for r in _jsonl(folder / "math500.jsonl")]),
        "aime2024.jsonl": ("aime2024", [(r["ID"], str(r["Answer"])) for r in _jsonl(folder / "aime2024.jsonl")]),
        "aime2025.jsonl": ("aime2025", [(str(r["id"]), r["answer"]) for r in _jsonl(folder / "aime2025.jsonl")]),
        "amc23.jsonl": ("amc23", [(str(i), r["answer"]) for i, r in enumerate(_jsonl(folder / "amc23.jsonl"))]),
        "olympiadbench_math_en.jsonl": ("olympiadbench", ob(folder / "olympiadbench_math_en.jsonl")),
        "math_train.jsonl": (
            "math_train",
            [(str(i), _last_boxed_simple(r["solution"])) for i, r in enumerate(math_rows)],
        ),
        "dapo_math_sample.jsonl": ("dapo_math", dapo(folder / "dapo_math_sample.jsonl")),
        "variants/aime2024_h4style_qwen.jsonl": (
            "aime2024",
            [(str(r["id"]), r["answer"]) for r in _jsonl(v / "aime2024_h4style_qwen.jsonl")],
        ),
        "variants/aime2024_maxwelljia.parquet": (
            "aime2024",
            [
                (r["ID"], str(r["Answer"]))
                for r in pd.read_parquet(v / "aime2024_maxwelljia.parquet").to_dict("records")
            ],
        ),
        "variants/aime2025_aops_text.jsonl": (
            "aime2025",
            [(str(i), r["answer"]) for i, r in enumerate(_jsonl(v / "aime2025_aops_text.jsonl"))],
        ),
        "variants/olympiadbench_math_en_qwen675.jsonl": (
            "olympiadbench",
            ob(v / "olympiadbench_math_en_qwen675.jsonl"),
        ),
        "variants/dapo_math_svs_variant_500.jsonl": ("dapo_math", dapo(v / "dapo_math_svs_variant_500.jsonl")),
    }


def _norm(answer: str) -> str:
    """Spelling-insensitive key so that mismatched pairs really differ ("7.0" and "7" are the same answer)."""
    text = answer.replace(" ", "").replace("$", "")
    try:
        return repr(float(text))
    except ValueError:
        return text


def _responses(raw: str) -> list[str]:
    bare = re.sub(r"(?<!\\)\$", "", raw)
    return [f"Let me work it out.\nAnswer: {raw}", f"Hence the result is $\\boxed{{{bare}}}$."]


@pytest.mark.slow
def test_acceptance_every_row_of_every_file(hub_data, tmp_path, capsys):
    import importlib

    t_start = time.monotonic()
    rng = random.Random(0)
    self_total = self_ok = pair_total = pair_ok = 0
    lines, failures, false_pos, jobs_self, jobs_pair = [], [], [], [], []
    for rel, (module, raw_rows) in _raw_cases(hub_data).items():
        out = importlib.import_module(f"ebpo_verl.data.{module}").prepare(
            tmp_path / rel.replace("/", "_"), local_path=hub_data / rel, skip_invalid=True
        )
        gold = {e["source_id"]: rm["ground_truth"] for e, rm in zip(*_cols(out), strict=True)}
        rows = [(sid, raw, gold[sid]) for sid, raw in raw_rows if sid in gold]  # skipped/duplicate rows absent
        assert len(rows) == len(gold), rel
        jobs_self += [(rel, sid, gt, _responses(raw)) for sid, raw, gt in rows]
        # mismatched pairs: each sampled row gets another row's answer (answers written differently)
        sample = rows if len(rows) <= 300 else rng.sample(rows, 300)
        for sid, _raw, gt in sample:
            other = rng.choice(rows)
            while other[0] == sid or _norm(other[1]) == _norm(gt):
                other = rng.choice(rows)
            jobs_pair.append((rel, sid, gt, rng.choice(_responses(other[1])), other[1]))

    with ThreadPoolExecutor(R.MAX_WORKERS) as ex:
        self_scores = list(
            ex.map(lambda j: [R.compute_score("acc", r, j[2], timeout=30)["score"] for r in j[3]], jobs_self)
        )
        pair_scores = list(ex.map(lambda j: R.compute_score("acc", j[3], j[2], timeout=30)["score"], jobs_pair))

    per_file: dict[str, list[int]] = {}
    for job, scores in zip(jobs_self, self_scores, strict=True):
        st = per_file.setdefault(job[0], [0, 0, 0, 0])
        for response, s in zip(job[3], scores, strict=True):
            st[0] += 1
            st[1] += s == 1.0
            if s != 1.0:
                failures.append((job[0], job[1], job[2], response))
    for job, s in zip(jobs_pair, pair_scores, strict=True):
        st = per_file[job[0]]
        st[2] += 1
        st[3] += s == 0.0
        if s != 0.0:
            false_pos.append((job[0], job[2], job[4]))
    for rel, (n, ok, m, zero) in per_file.items():
        lines.append(f"  {rel:48s} own answer 1: {ok}/{n} ({ok / n:.2%})   other answer 0: {zero}/{m} ({zero / m:.2%})")
        self_total, self_ok, pair_total, pair_ok = self_total + n, self_ok + ok, pair_total + m, pair_ok + zero
    elapsed = time.monotonic() - t_start
    with capsys.disabled():
        print("\nreward acceptance (own answer in Answer:/\\boxed{} forms; another row's answer):")
        print("\n".join(lines))
        print(
            f"  TOTAL own answer 1: {self_ok}/{self_total} ({self_ok / self_total:.4%}); "
            f"other answer 0: {pair_ok}/{pair_total} ({pair_ok / pair_total:.4%}); {elapsed:.0f}s"
        )
        for rel, gt, other in false_pos[:20]:
            print(f"  scored 1 with another row's answer: {rel}: gold {gt!r} vs {other!r}")
    assert not failures, failures[:10]
    assert pair_ok / pair_total >= 0.99


def _prepared_gold(shared: Path, tmp_path: Path, rel: str, module: str) -> dict[str, str]:
    import importlib

    out = importlib.import_module(f"ebpo_verl.data.{module}").prepare(
        tmp_path / rel, local_path=shared / rel, skip_invalid=True
    )
    return {e["source_id"]: rm["ground_truth"] for e, rm in zip(*_cols(out), strict=True)}


def test_every_reference_solution_grades_one(shared_data, tmp_path):
    """MATH-500 and MATH train reference solutions, used as responses, grade 1 against the prepared answer
    (MATH-500 rows 283 and 448 say "our answer:" mid-sentence; the two train rows with an empty box are
    dropped by the preparer)."""
    m500 = _jsonl(shared_data / "math500.jsonl")
    train = _jsonl(shared_data / "math_train.jsonl")
    cases = [
        (rel, solution_by_id, _prepared_gold(shared_data, tmp_path, rel, module))
        for rel, module, solution_by_id in (
            ("math500.jsonl", "math500", {r["unique_id"]: r["solution"] for r in m500}),
            ("math_train.jsonl", "math_train", {str(i): r["solution"] for i, r in enumerate(train)}),
        )
    ]
    jobs = [(rel, sid, solutions[sid], gt) for rel, solutions, gold in cases for sid, gt in gold.items()]
    assert len(jobs) == 500 + 7498
    with ThreadPoolExecutor(R.MAX_WORKERS) as ex:
        scores = list(ex.map(lambda j: R.compute_score("ref", j[2], j[3], timeout=30)["score"], jobs))
    failed = [(rel, sid, gt) for (rel, sid, _, gt), s in zip(jobs, scores, strict=True) if s != 1.0]
    assert not failed, failed[:10]
    assert [s for (rel, sid, _, _), s in zip(jobs, scores, strict=True) if rel == "math500.jsonl"][283] == 1.0


def test_long_responses_ending_in_the_right_box_grade_one(hub_data):
    """~20k-character responses of MATH solution text (including its mid-sentence "answer:" phrases), each ending
    in the gold \\boxed{}: every one grades 1, and the same text ending in a wrong box grades 0."""
    train = _jsonl(hub_data / "math_train.jsonl")
    with_answer_word = [r["solution"] for r in train if re.search(r"(?i)answer\s*:", r["solution"])]
    assert with_answer_word
    rng = random.Random(3)
    answered = [r for r in train if _last_boxed_simple(r["solution"])]  # not the rows with an empty box
    rows = rng.sample(answered, min(150, len(answered)))
    responses = []
    for r in rows:
        gold = _last_boxed_simple(r["solution"])
        parts = [rng.choice(with_answer_word)]
        while sum(map(len, parts)) < 20_000:
            parts.append(rng.choice(train)["solution"])
        rng.shuffle(parts)
        responses.append(("\n\n".join(parts) + f"\n\nSo the result is $\\boxed{{{gold}}}$.", gold))
    with ThreadPoolExecutor(R.MAX_WORKERS) as ex:
        right = list(ex.map(lambda j: R.compute_score("long", j[0], j[1], timeout=30)["score"], responses))
        wrong = list(
            ex.map(
                lambda j: R.compute_score(
                    "long", j[0].rsplit("\\boxed", 1)[0] + "\\boxed{-987654}$.", j[1], timeout=30
                )["score"],
                responses,
            )
        )
    assert right == [1.0] * len(rows)
    assert wrong == [0.0] * len(rows)


def _cols(path: Path):
    df = pd.read_parquet(path)
    return df["extra_info"].tolist(), df["reward_model"].tolist()
