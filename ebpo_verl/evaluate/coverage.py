"""pass@k, maj@k and avg@n of a benchmark from its n samples per problem, pure Python; the definitions (maj@k's
blocks and tie rule, the standard errors over problems) are in docs/evaluation.md#coverage.

A problem is given as its samples in sample order, each a (class, correct) pair: ``class`` is the id of the
answer's equivalence class under the protocol (None: the sample states no answer), ``correct`` the grader's
verdict. Every number is a mean over problems, in percent, with its standard error (None for fewer than 2).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

Sample = tuple[Any, bool]
"""(answer class or None, graded correct)."""


def ks_for(n: int) -> list[int]:
    """The k reported for n samples per problem: 1, 2, 4, ... up to n, and n itself."""
    if n < 1:
        raise ValueError(f"n = {n}: need at least one sample per problem")
    ks = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return ks if ks[-1] == n else [*ks, n]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` of ``n`` samples correct: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def block_vote(classes: Sequence[Any], correct: dict[Any, bool]) -> float:
    """One block's majority vote: 1 or 0, a tie the correct share of the tied classes, 0 if no sample answers."""
    votes = Counter(c for c in classes if c is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [c for c, v in votes.items() if v == top]
    return sum(correct[c] for c in tied) / len(tied)


def maj_at_k(samples: Sequence[Sample], k: int) -> float:
    """maj@k of one problem: the mean vote over its ``n // k`` blocks of k consecutive samples."""
    n = len(samples)
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n (n={n}, k={k})")
    correct = {cls: bool(ok) for cls, ok in reversed(samples) if cls is not None}  # a class's first sample's verdict
    blocks = [[cls for cls, _ in samples[b * k : (b + 1) * k]] for b in range(n // k)]
    return sum(block_vote(block, correct) for block in blocks) / len(blocks)


def mean_and_stderr(values: Sequence[float]) -> tuple[float | None, float | None]:
    """(100 x mean, 100 x standard error over the values), None where undefined."""
    if not values:
        return None, None
    se = 100.0 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
    return 100.0 * statistics.fmean(values), se


def benchmark_coverage(problems: Sequence[Sequence[Sample]]) -> dict[str, Any]:
    """``{"n", "pass@k", "pass@k_stderr", "maj@k", "maj@k_stderr", "avg@n", "avg@n_stderr"}`` of a benchmark whose
    problems all have the same number n of samples (keys of the per-k maps: str(k))."""
    sizes = {len(p) for p in problems}
    if len(sizes) != 1:
        raise ValueError(f"every problem needs the same number of samples (found {sorted(sizes)})")
    (n,) = sizes
    out: dict[str, Any] = {"n": n, "pass@k": {}, "pass@k_stderr": {}, "maj@k": {}, "maj@k_stderr": {}}
    for k in ks_for(n):
        for name, per_problem in (
            ("pass@k", [pass_at_k(n, sum(ok for _, ok in p), k) for p in problems]),
            ("maj@k", [maj_at_k(p, k) for p in problems]),
        ):
            out[name][str(k)], out[f"{name}_stderr"][str(k)] = mean_and_stderr(per_problem)
    out["avg@n"], out["avg@n_stderr"] = mean_and_stderr([sum(ok for _, ok in p) / n for p in problems])
    return out


def common_average(benchmarks: Sequence[dict[str, Any]], name: str) -> dict[str, float]:
    """Mean over benchmarks of metric ``name`` (``pass@k`` or ``maj@k``) for the k that every benchmark has."""
    maps = [b.get(name) or {} for b in benchmarks]
    if not maps:
        return {}
    shared = set.intersection(*(set(m) for m in maps))
    ks = sorted((k for k in shared if all(m[k] is not None for m in maps)), key=int)
    return {k: statistics.fmean(m[k] for m in maps) for k in ks}
