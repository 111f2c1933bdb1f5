"""The two evaluation protocols: which rows, which prompt, which ground truth, how many runs, which grader.

``paper`` is the authors' evaluation (docs/paper_notes.md#evaluation): a RAW prompt string (no chat template),
the DAPO instruction prefix + blank line + the problem as the source gives it (OlympiadBench: ``question``
only, ground truth = the first element of ``final_answer``), temperature 1.0, top-p 1.0, 20,480 new tokens,
16 runs (OlympiadBench 4), graded by :func:`ebpo_verl.paper_reward.grade_eval`.
``verl`` is what verl's validation does with our parquets: the row's chat prompt through the tokenizer's chat
template, graded by :func:`ebpo_verl.reward.compute_score`, 16 runs everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebpo_verl.data.schema import CHAT_FORMAT, DAPO_PREFIX, DataPrepError, chat_prompt_problem, read_prepared
from ebpo_verl.reward import missing_ground_truth

BENCHMARKS = ("math500", "aime2024", "aime2025", "amc23", "olympiadbench")
PROTOCOLS = ("paper", "verl")
PAPER_RUNS = {"math500": 16, "aime2024": 16, "aime2025": 16, "amc23": 16, "olympiadbench": 4}
VERL_RUNS = 16
MAX_NEW_TOKENS = 20480
TEMPERATURE = 1.0
TOP_P = 1.0


class EvalInputError(ValueError):
    """Bad input to the evaluation (unknown benchmark, missing file, corrupt generations): one clear line."""


@dataclass(frozen=True)
class Problem:
    """One benchmark row as a protocol sees it: ``prompt`` is a string (paper) or chat messages (verl)."""

    benchmark: str
    index: int
    prompt: str | list[dict[str, str]]
    ground_truth: str


def runs_for(protocol: str, benchmark: str) -> int:
    """Runs (samples per problem) of ``benchmark`` under ``protocol``."""
    return PAPER_RUNS[benchmark] if protocol == "paper" else VERL_RUNS


def check_names(protocol: str, benchmarks: list[str]) -> None:
    """Raise EvalInputError for an unknown protocol or benchmark name."""
    if protocol not in PROTOCOLS:
        raise EvalInputError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
    unknown = [b for b in benchmarks if b not in BENCHMARKS]
    if unknown:
        raise EvalInputError(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}")


def load_problems(data_dir: str | Path, benchmark: str, protocol: str, limit: int | None = None) -> list[Problem]:
    """The first ``limit`` (all when None) rows of ``data_dir/<benchmark>.parquet`` as ``protocol`` prompts them."""
    check_names(protocol, [benchmark])
    path = Path(data_dir) / f"{benchmark}.parquet"
    remake = f"python -m ebpo_verl.data.all --out-dir {data_dir} --only {benchmark}"
    if not path.is_file():
        raise EvalInputError(f"{path} does not exist; prepare it with {remake}")
    try:
        rows: list[dict[str, Any]] = read_prepared(path).to_pylist()
    except DataPrepError as e:  # unreadable, not ebpo_verl.data columns, or a ground truth that is None/NaN/empty
        raise EvalInputError(str(e)) from None
    problems = [
        _problem(path, benchmark, protocol, i, row, f"re-create it with {remake}") for i, row in enumerate(rows[:limit])
    ]
    seen: dict[int, int] = {}
    for i, problem in enumerate(problems):
        if (first := seen.setdefault(problem.index, i)) != i:
            raise EvalInputError(
                f"{path}: rows {first} and {i} (0-based) share extra_info.index {problem.index}, which keys the "
                f"samples; re-create it with {remake}"
            )
    return problems


def _problem(path: Path, benchmark: str, protocol: str, i: int, row: dict[str, Any], remake: str) -> Problem:
    """Row ``i`` of ``path`` as ``protocol`` prompts it; EvalInputError naming the row and the fix (``remake``) when
    a field the protocol reads is missing or of the wrong type."""
    info = row["extra_info"] if isinstance(row["extra_info"], dict) else {}
    index = info.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise EvalInputError(f"{path}: row {i} (0-based) has no extra_info.index (an integer >= 0); {remake}")
    if protocol == "paper":
        if info.get("raw_problem") is None or info.get("raw_answer") is None:
            raise EvalInputError(
                f"{path} has no extra_info.raw_problem/raw_answer (written by an older ebpo_verl.data); {remake}"
            )
        if not isinstance(info["raw_problem"], str) or not isinstance(info["raw_answer"], str):
            raise EvalInputError(f"{path}: row {i} (0-based): extra_info.raw_problem/raw_answer are not text; {remake}")
        if missing_ground_truth(info["raw_answer"]) is not None:
            raise EvalInputError(
                f"{path}: row {i} (0-based) has an empty extra_info.raw_answer, which nothing can match; "
                "give it the reference answer or drop the row"
            )
        return Problem(benchmark, index, DAPO_PREFIX + info["raw_problem"], info["raw_answer"])  # raw, no template
    if why := chat_prompt_problem(row["prompt"]):
        raise EvalInputError(
            f"{path}: row {i} (0-based): prompt is {why}; the verl protocol needs {CHAT_FORMAT}; {remake}"
        )
    prompt = [{"role": m["role"], "content": m["content"]} for m in row["prompt"]]
    return Problem(benchmark, index, prompt, row["reward_model"]["ground_truth"])
