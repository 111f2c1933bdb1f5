"""Coverage in the study: held-out pass@k from the exact per-prompt success probabilities, its paired
differences EBPO - X at each k, the report's coverage section and its pass@k-vs-k figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ebpo_verl.study.report import (
    COVERAGE_K,
    REFERENCE,
    finish,
    mean_ci,
    mean_line,
    paired,
    paired_table,
    paired_verdict,
    panels,
    pass_at_k,
    run_pass_at_k,
    select,
    table,
    warm_start_pass_at_k,
)

FIGURE_K = tuple(2**i for i in range(7))
"""The k of the pass@k-vs-k figure: 1, 2, 4, ..., 64."""
FIGURE = "pass_at_k.png"


def draw(out: Path, runs: list[dict], estimators: list[str], group_sizes: list[int], base_info: dict, source: str):
    """Draw :data:`FIGURE` into ``out``: one panel per G (random order), final held-out pass@k against k (log
    scale), one line per estimator (mean over seeds, 95% t-interval error bars, shifted apart along k), the warm
    start's pass@k dotted, ``source`` under the figure. Returns its caption for the report's list of figures."""
    probs = base_info.get("heldout_pass")
    warm = [pass_at_k(probs, k) for k in FIGURE_K] if probs else None
    ks = np.asarray(FIGURE_K, dtype=float)
    fig, axes = panels(len(group_sizes))
    seeds = set()
    for ax, g in zip(axes[0], group_sizes, strict=True):
        if warm is not None:
            ax.plot(ks, warm, label="warm start", **REFERENCE)
        for i, est in enumerate(estimators):
            sel = select(runs, estimator=est, group_size=g, order="random")
            if not sel:
                continue
            seeds.add(len(sel))
            mean, half, _ = np.asarray([mean_ci([run_pass_at_k(r, k) for r in sel]) for k in FIGURE_K]).T
            dodge = 2.0 ** ((i - (len(estimators) - 1) / 2) * 0.05)
            mean_line(ax, est, i, ks, mean, np.nan_to_num(half), np.arange(len(ks)), ks * dodge, 1.0)  # in [0, 1]
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [f"{k:g}" for k in ks])
        ax.set_title(f"G = {g}", fontsize=10)
        ax.set_xlabel("k (samples per prompt)")
        ax.grid(alpha=0.3)
    n = "/".join(str(x) for x in sorted(seeds))
    note = (
        f"Final models; lines: mean over {n} seeds of the exact pass@k (mean over held-out prompts of "
        "1 - (1 - p)^k); error bars: 95% t-intervals over seeds (shifted apart along k); dotted: the warm start."
    )
    finish(fig, axes, "held-out pass@k", note, source, out / FIGURE)
    return "held-out pass@k of the final models against k (1 to 64), one panel per G; dotted: the warm start"


def coverage_section(
    runs: list[dict],
    by_cell: dict,
    estimators: list[str],
    group_sizes: list[int],
    base_info: dict,
    seeds: int | None = None,
):
    """The report's coverage section: pass@k per cell at the k > 1 of :data:`COVERAGE_K` and the paired
    differences EBPO - X at each k (pass@1's are the section above); a cell over fewer than ``seeds`` runs shows
    (n/seeds)."""
    warm = warm_start_pass_at_k(base_info)
    warm_text = ", ".join(f"pass@{k} {warm[k]:.3f}" if warm[k] is not None else f"pass@{k} n/a" for k in warm)
    parts = [
        f"""## Coverage: held-out pass@k (k = {", ".join(map(str, COVERAGE_K))})
pass@k is the mean over the held-out prompts of 1 - (1 - p)^k, p the prompt's exact success probability at
temperature 1: the chance that at least one of k independent samples is right, exact as pass@1 is (pass@1 is the
accuracy above). Warm start: {warm_text}. Figure: [{FIGURE}]({FIGURE})."""
    ]
    for k in (k for k in COVERAGE_K if k > 1):
        pairs = paired(runs, estimators, group_sizes, k=k)
        parts.append(f"""### pass@{k} (rows = estimator, columns = G; random order)

{table(by_cell, estimators, group_sizes, f"pass_at_{k}", "G", seeds=seeds)}

EBPO - X in pass@{k}, paired by seed as above:

{paired_table(pairs, group_sizes)}

{paired_verdict(pairs)}""")
    parts.append(
        "What this measures: whether a final policy still puts probability on the right answer of prompts it\n"
        "rarely solves (pass@64 counts a prompt with p = 0.05 as 96% solved). It compares the estimators' coverage\n"
        "on this testbed only: one warm start, a ~10^5-parameter model, answers of a few tokens."
    )
    return "\n\n".join(parts) + "\n\n"
