"""The numbers reported by Han et al., "EBPO: Empirical Bayes Shrinkage for Stabilizing Group-Relative Policy
Optimization" (arXiv 2602.05165), as :mod:`ebpo_verl.recipes.make_tables` compares against them.

All values are Pass@1 in percent (mean over 16 samples at temperature 1.0), G=4 and topic-ordered batches unless
the table says otherwise. ``PAPER[table][section][method]`` maps ``"avg"`` (the mean of the five benchmarks) and,
where the paper prints them, the benchmark names to a number. ``CONTRASTS`` holds differences the paper reports
without absolute numbers. Sections and methods are listed in the paper's order; the method names are the row
labels of :mod:`ebpo_verl.recipes.tables`.
"""

from __future__ import annotations

from ebpo_verl.evaluate.prompts import BENCHMARKS as NAMES

_LABELS = {
    "math500": "MATH-500",
    "aime2024": "AIME24",
    "aime2025": "AIME25",
    "amc23": "AMC23",
    "olympiadbench": "Olympiad",
}
BENCHMARKS: dict[str, str] = {name: _LABELS[name] for name in NAMES}
"""verl data_source of each benchmark (``ebpo_verl.evaluate.prompts.BENCHMARKS``) -> column label."""


def _per_benchmark(*scores: float, avg: float) -> dict[str, float]:
    """The numbers of a row the paper prints per benchmark, in :data:`BENCHMARKS` order, and their average."""
    return {**dict(zip(BENCHMARKS, scores, strict=True)), "avg": avg}


def _averages(avg: dict[str, float]) -> dict[str, dict[str, float]]:
    """Rows the paper prints only the five-benchmark average of: method -> {"avg": number}."""
    return {method: {"avg": number} for method, number in avg.items()}


PAPER: dict[str, dict[str, dict[str, dict[str, float]]]] = {
    # Main table (v1/v3), plus the v2 draft's REINFORCE++, RLOO, SPO and EBPO-BB rows.
    "main": {
        "Qwen3-8B": {
            **_averages({"GRPO": 58.72, "Dr.GRPO": 56.27, "DAPO": 52.63, "EntropyMech": 49.18}),
            "EBPO": _per_benchmark(76.80, 56.04, 47.92, 86.25, 54.93, avg=64.39),
            **_averages({"REINFORCE++": 63.13, "RLOO": 62.20, "SPO": 62.37, "EBPO-BB": 65.69}),
        },
        "Qwen3-14B": _averages(
            {"GRPO": 59.88, "Dr.GRPO": 60.16, "DAPO": 61.34, "EntropyMech": 54.02, "EBPO": 61.75, "EBPO-BB": 62.45}
        ),
        "LLaMA3.1-8B": _averages({"GRPO": 9.00, "Dr.GRPO": 8.89, "DAPO": 7.50, "EntropyMech": 6.39, "EBPO": 9.97}),
    },
    # Group size, Qwen3-8B.
    "group_size": {
        "G=8": _averages({"EBPO": 65.54, "GRPO": 54.26, "DAPO": 46.69}),
        "G=16": _averages({"EBPO": 64.64, "GRPO": 63.16, "DAPO": 56.36}),
        "G=32": _averages({"EBPO": 62.41, "GRPO": 62.91, "DAPO": 56.90}),
    },
    # Ordering ablation: GPT-4.1 topic labels (the main-table EBPO run), no ordering, BERTopic-style labels.
    "ordering": {
        "Qwen3-8B": _averages(
            {"EBPO-topic (GPT-4.1 labels)": 64.39, "EBPO-topic (embedding labels)": 64.93, "EBPO-naive": 60.00}
        ),
        "Qwen3-14B": _averages(
            {"EBPO-topic (GPT-4.1 labels)": 61.75, "EBPO-topic (embedding labels)": 61.12, "EBPO-naive": 59.91}
        ),
    },
    # GRPO with batch-std normalisation isolates the shrinkage; GRPO and EBPO rows from the main table.
    "grpo_bn": {
        "Qwen3-8B": _averages({"GRPO": 58.72, "GRPO+BN": 57.71, "EBPO": 64.39}),
        "Qwen3-14B": _averages({"GRPO": 59.88, "GRPO+BN": 59.98, "EBPO": 61.75}),
    },
    # Curriculum (easy -> hard, one epoch, base model): the paper prints absolute numbers only in a figure, so
    # the rows carry the authors' own eval logs of the step-34 checkpoints under the paper protocol
    # (docs/paper_notes.md#logged-numbers; PAPER_LABEL says so in the tables).
    "curriculum": {
        "Qwen3-8B-Base": {
            "EBPO-diff": _per_benchmark(54.41, 10.42, 9.58, 40.63, 25.56, avg=28.12),
            "GRPO-diff": _per_benchmark(54.90, 9.38, 9.17, 36.41, 25.22, avg=27.01),
            "Dr.GRPO-diff": _per_benchmark(55.56, 12.92, 9.58, 37.19, 24.15, avg=27.88),
            "DAPO-diff": _per_benchmark(53.74, 8.96, 7.92, 37.03, 23.33, avg=26.19),
        },
        "Qwen3-14B-Base": {
            "EBPO-diff": _per_benchmark(63.80, 12.08, 13.96, 51.72, 30.97, avg=34.51),
            "GRPO-diff": _per_benchmark(60.06, 11.04, 10.83, 43.28, 28.12, avg=30.67),
        },
    },
}

# Where a table's reference numbers come from, when not the paper's text (the label of its reference rows).
PAPER_LABEL: dict[str, str] = {"curriculum": "authors' logs, step 34"}


def _logged_difference(section: str, plus: str, minus: str) -> dict[str, float]:
    a, b = PAPER["curriculum"][section][plus], PAPER["curriculum"][section][minus]
    return {bench: round(a[bench] - b[bench], 2) for bench in BENCHMARKS}


# table -> section -> [(method, minus method, {reference label: {benchmark: difference in points}})]. The
# curriculum figure's EBPO-diff minus GRPO-diff (+3.95 / +6.04) is not what the authors' own logs give
# (+1.04 / +0.41): both are shown.
CONTRASTS: dict[str, dict[str, list[tuple[str, str, dict[str, dict[str, float]]]]]] = {
    "curriculum": {
        section: [
            (
                "EBPO-diff",
                "GRPO-diff",
                {**figure, PAPER_LABEL["curriculum"]: _logged_difference(section, "EBPO-diff", "GRPO-diff")},
            )
        ]
        for section, figure in (
            ("Qwen3-8B-Base", {"paper figure": {"aime2024": 3.95, "aime2025": 6.04}}),
            ("Qwen3-14B-Base", {}),
        )
    },
}
