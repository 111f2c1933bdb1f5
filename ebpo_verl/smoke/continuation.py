"""The continuation check: a resumed EB state equals the checkpointed state merged with the resumed batches.

Recomputed here with numpy from the rewards in verl's rollout dump, independently of the estimator's own code:
for the global scope and every cluster, the count, mean and M2 of the rewards, of the group means, of the
unbiased within-group variances (groups of two or more) and of 1/G; the merge of the saved (n, mean, M2) with a
batch's is the pooled-sums identity written out below.
"""

from __future__ import annotations

import numpy as np

PARTS = ("rewards", "group_means", "within_var", "inv_group_size")
REL, ABS = 1e-9, 1e-12
"""Tolerance: the estimator sums in value order, numpy pairwise; both are float64 of the same values."""


def moments(values) -> tuple[float, float, float]:
    """(n, mean, M2) of ``values`` (M2: sum of squared deviations from the mean)."""
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return 0.0, 0.0, 0.0
    mean = float(a.mean())
    return float(a.size), mean, float(((a - mean) ** 2).sum())


def pooled(saved, batch) -> tuple[float, float, float]:
    """(n, mean, M2) of the union of two samples given each one's (n, mean, M2)."""
    (n0, m0, s0), (n1, m1, s1) = saved, batch
    n = n0 + n1
    if n == 0:
        return 0.0, 0.0, 0.0
    return n, (n0 * m0 + n1 * m1) / n, s0 + s1 + (m1 - m0) ** 2 * n0 * n1 / n


def scope_parts(groups: list[list[float]]) -> dict[str, tuple[float, float, float]]:
    """The four parts' (n, mean, M2) over ``groups`` (each a prompt's rewards)."""
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    return {
        "rewards": moments(np.concatenate(arrays) if arrays else []),
        "group_means": moments([a.mean() for a in arrays]),
        "within_var": moments([a.var(ddof=1) for a in arrays if a.size >= 2]),
        "inv_group_size": moments([1.0 / a.size for a in arrays]),
    }


def compare_scope(what: str, saved: dict | None, after: dict | None, groups: list[list[float]]) -> list[str]:
    """Mismatches of one scope (``saved``/``after``: ``{part: [n, mean, M2]}``, None when absent)."""
    if after is None:
        return [f"{what}: missing from the resumed state"]
    batch = scope_parts(groups)
    out = []
    for part in PARTS:
        want = pooled(tuple(saved[part]) if saved else (0.0, 0.0, 0.0), batch[part])
        got = after[part]
        for label, g, w in zip(("count", "mean", "M2"), got, want, strict=True):
            if not np.isclose(g, w, rtol=REL, atol=ABS):
                out.append(f"{what}.{part} {label}: resumed {g!r} != saved + batches {w!r}")
    return out


def check_continues(saved: dict, after: dict, batches: list[list[tuple[str | None, list[float]]]]) -> str:
    """``after`` (a saved EB state) is ``saved`` plus exactly ``batches``: one per resumed step, each a list of
    (cluster label or None, the prompt's rewards). Raises AssertionError listing every mismatch."""
    groups = [g for batch in batches for g in batch]
    problems = []
    if after["steps"] != saved["steps"] + len(batches):
        problems.append(f"EB steps {saved['steps']} + {len(batches)} != {after['steps']}")
    if after["prompts_seen"] != saved["prompts_seen"] + len(groups):
        problems.append(f"prompts_seen {saved['prompts_seen']} + {len(groups)} != {after['prompts_seen']}")
    problems += compare_scope("global", saved["global"], after["global"], [r for _, r in groups])
    labels = {label for label, _ in groups if label is not None}
    if set(after["clusters"]) != set(saved["clusters"]) | labels:
        problems.append(f"clusters {sorted(after['clusters'])} != saved {sorted(saved['clusters'])} + {sorted(labels)}")
    for label in sorted(set(saved["clusters"]) | labels):
        mine = [r for lab, r in groups if lab == label]
        before, now = saved["clusters"].get(label), after["clusters"].get(label)
        problems += compare_scope(f"cluster {label!r}", before, now, mine)
    if problems:
        raise AssertionError("[cpu_smoke] the resumed EB state does not continue the saved one: " + "; ".join(problems))
    return f"count, mean, M2 of 4 parts in the global scope and {len(after['clusters'])} clusters"
