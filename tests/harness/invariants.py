"""The invariants the smoke runs (:func:`check_continues`) and a random-kill campaign
(`tests/harness/campaign.py`) check, each computed independently of the trainer: every step logged once, the EB
state recomputed from verl's rollout dumps with numpy power sums (not the package's Chan merge; for the global scope
and every cluster, the count, mean and M2 of the rewards, of the group means, of the unbiased within-group variances
of groups of two or more and of 1/G), the metrics against the uninterrupted run's, the responses as a sorted
multiset. docs/training_faults.md lists them with a K=8 run."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

PARTS = ("rewards", "group_means", "within_var", "inv_group_size")
REL_TOL = 1e-9
"""Recomputed EB state vs the saved one: the saved one merges with Chan et al.'s formula, the check with raw power
sums (another rounding; they agree to a few ulps here); M2 is compared relative to n * mean^2 + M2."""
METRIC_TOL = 1e-3
"""Campaign vs uninterrupted run, per metric: |a - b| <= METRIC_TOL * max(1, |b|). Measured spread where the runs'
responses agree (the resumed run sums the same batch in another order): K=8 seed 8, at most 5.5e-4 (the
rollout-actor probability correlation; the grad norm 4.5e-4; the rest within 1.3e-6 or exact); K=8 seed 19
(docs/campaign_k8_seed19.json), 592 bound values, 531 identical, at most 5.9e-4 (step 7's actor/grad_norm). The
tolerance is 1.7x the largest of them (docs/training_faults.md)."""
SKIPPED_METRICS = ("timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/", "rollout_corr/")
"""Timings, throughput and memory use (they differ between any two runs), and verl's rollout-vs-actor mismatch
diagnostics (perplexity ratios, chi^2 of two nearly equal sets of log-probabilities): measured here, they move by
their own size (chi2_seq -0.016 vs -0.037 at step 11) when the weights differ in the last bits."""


def check_steps_once(steps: list[int], total: int) -> None:
    """The steps of the training records in the metrics log, in file order, are 1..total, each exactly once."""
    dupes = sorted({s for s in steps if steps.count(s) > 1})
    missing = sorted(set(range(1, total + 1)) - set(steps))
    if dupes or missing or steps != list(range(1, total + 1)):
        raise AssertionError(f"metrics log steps {steps}: duplicated {dupes}, missing {missing} (want 1..{total})")


def batch_groups(dump_lines: Iterable[str], label_of) -> list[tuple[str, np.ndarray]]:
    """(cluster label, rewards) per prompt group of a verl rollout dump (``label_of(input text)``)."""
    groups: dict[str, list[float]] = {}
    for line in dump_lines:
        entry = json.loads(line)
        groups.setdefault(entry["input"], []).append(float(entry["score"]))
    return [(label_of(text), np.array(scores, dtype=np.float64)) for text, scores in groups.items()]


def _merged(old: list[float], values: np.ndarray, weights: np.ndarray) -> list[float]:
    """``old`` = [n, mean, M2] merged with weighted ``values`` through raw power sums (not Chan's formula)."""
    n = old[0] + weights.sum()
    if n == 0:
        return [0.0, 0.0, 0.0]
    s1 = old[0] * old[1] + (weights * values).sum()
    s2 = old[2] + old[0] * old[1] ** 2 + (weights * values**2).sum()
    mean = s1 / n
    return [float(n), float(mean), float(max(s2 - n * mean * mean, 0.0))]


def _scope_update(old: dict[str, list[float]] | None, groups: list[np.ndarray]) -> dict[str, list[float]]:
    old = old or {p: [0.0, 0.0, 0.0] for p in PARTS}
    rewards = np.concatenate(groups)
    sizes = np.array([g.size for g in groups], dtype=np.float64)
    within = np.array([g.var(ddof=1) if g.size >= 2 else 0.0 for g in groups])
    series = {
        "rewards": (rewards, np.ones_like(rewards)),
        "group_means": (np.array([g.mean() for g in groups]), np.ones_like(sizes)),
        "within_var": (within, (sizes >= 2).astype(np.float64)),
        "inv_group_size": (1.0 / sizes, np.ones_like(sizes)),
    }
    return {p: _merged(old[p], *series[p]) for p in PARTS}


def expected_state(saved: dict[str, Any], groups: list[tuple[str, np.ndarray]]) -> dict[str, Any]:
    """The EB state after one batch (``batch_groups``) merged into ``saved`` (no decay), recomputed with numpy."""
    out = {
        "steps": saved["steps"] + 1,
        "prompts_seen": saved["prompts_seen"] + len(groups),
        "responses_seen": saved["responses_seen"] + sum(g.size for _, g in groups),
        "global": _scope_update(saved["global"], [g for _, g in groups]),
        "clusters": dict(saved["clusters"]),
    }
    for label in sorted({label for label, _ in groups}):
        out["clusters"][label] = _scope_update(saved["clusters"].get(label), [g for lab, g in groups if lab == label])
    return out


def _close(want: list[float], got: list[float]) -> bool:
    n, mean, m2 = want
    scale = abs(n * mean * mean) + m2 + 1.0
    return (
        got[0] == n
        and math.isclose(got[1], mean, rel_tol=REL_TOL, abs_tol=1e-12)
        and math.isclose(got[2], m2, rel_tol=REL_TOL, abs_tol=REL_TOL * scale)
    )


def check_state(want: dict[str, Any], got: dict[str, Any], where: str) -> None:
    """Counts equal; every scope's (n, mean, M2) of every part close (``REL_TOL``); the same cluster labels."""
    for key in ("steps", "prompts_seen", "responses_seen"):
        if got[key] != want[key]:
            raise AssertionError(f"{where}: EB {key} {got[key]} != {want[key]}")
    if sorted(got["clusters"]) != sorted(want["clusters"]):
        raise AssertionError(f"{where}: EB clusters {sorted(got['clusters'])} != {sorted(want['clusters'])}")
    scopes = [("global", want["global"], got["global"])]
    scopes += [(f"cluster {k!r}", want["clusters"][k], got["clusters"][k]) for k in sorted(want["clusters"])]
    for name, w, g in scopes:
        for part in PARTS:
            if not _close(w[part], g[part]):
                raise AssertionError(f"{where}: EB {name} {part} [n, mean, M2] {g[part]} != recomputed {w[part]}")


def check_continues(saved: dict, after: dict, batches: list[list[tuple[str | None, Any]]]) -> str:
    """``after`` (a saved EB state) is ``saved`` plus exactly ``batches`` (per resumed step, (cluster or None,
    rewards) per prompt) within :data:`REL_TOL`; AssertionError listing every mismatch."""
    groups = [(label, np.asarray(r, dtype=np.float64)) for batch in batches for label, r in batch]
    labels = {label for label, _ in groups if label is not None}
    problems = []
    if after["steps"] != saved["steps"] + len(batches):
        problems.append(f"EB steps {saved['steps']} + {len(batches)} != {after['steps']}")
    if after["prompts_seen"] != saved["prompts_seen"] + len(groups):
        problems.append(f"prompts_seen {saved['prompts_seen']} + {len(groups)} != {after['prompts_seen']}")
    scopes = [("global", saved["global"], after["global"], [g for _, g in groups])]
    if set(after["clusters"]) != set(saved["clusters"]) | labels:
        problems.append(f"clusters {sorted(after['clusters'])} != saved {sorted(saved['clusters'])} + {sorted(labels)}")
    for label in sorted(set(saved["clusters"]) | labels):
        mine = [g for lab, g in groups if lab == label]
        scopes.append((f"cluster {label!r}", saved["clusters"].get(label), after["clusters"].get(label), mine))
    for what, before, now, mine in scopes:
        if now is None:
            problems.append(f"{what}: missing from the resumed state")
            continue
        want = _scope_update(before, mine) if mine else before or {p: [0.0, 0.0, 0.0] for p in PARTS}
        for part in PARTS:
            for name, g, w in zip(("count", "mean", "M2"), now[part], want[part], strict=True):
                if not np.isclose(g, w, rtol=REL_TOL, atol=1e-12):
                    problems.append(f"{what}.{part} {name}: resumed {g!r} != saved + batches {w!r}")
    if problems:
        raise AssertionError("[cpu_smoke] the resumed EB state does not continue the saved one: " + "; ".join(problems))
    return f"count, mean, M2 of 4 parts in the global scope and {len(after['clusters'])} clusters"


VAL_PREFIX = "val-"
"""Validation metrics: compared only at steps whose validation dumps show the same responses in both runs."""
BOOTSTRAP_METRICS = ("/best@", "/worst@", "/maj@")
"""verl's bootstrap validation metrics (``process_validation_metrics``: seed 42, each prompt's responses resampled in
batch order): two runs whose samples of one prompt gave the same responses in swapped order differ there (the
platform CI of ec3ada8: best@2 and worst@2 of one step moved by 0.002, their stds swapped), so they bind only at
steps whose validation dumps (batch order) agree line by line."""


def compare_metrics(
    ref: dict[int, dict],
    got: dict[int, dict],
    steps: list[int],
    first_flip: int | None,
    val_same: set[int],
    val_in_order: set[int],
) -> dict:
    """Every metric both runs logged at ``steps`` (timings, memory, mismatch diagnostics aside), within
    ``METRIC_TOL * max(1, |reference|)``: training metrics before ``first_flip``, ``val-*`` metrics at ``val_same``
    steps (the bootstrap ones at ``val_in_order`` steps) must agree, the rest is listed as excused. Raises naming the
    first ten failures; returns the largest |difference| per key and what was compared where."""
    worst: dict[str, float] = {}
    failed, excused = [], []
    for step in steps:
        for key, want in ref[step].items():
            if key.startswith(SKIPPED_METRICS) or not isinstance(want, (int, float)) or key not in got[step]:
                continue
            a, b = float(got[step][key]), float(want)
            worst[key] = max(worst.get(key, 0.0), abs(a - b))
            if abs(a - b) <= METRIC_TOL * max(1.0, abs(b)):  # within (a NaN is beyond)
                continue
            if key.startswith(VAL_PREFIX) and any(part in key for part in BOOTSTRAP_METRICS):
                binding, why = step in val_in_order, "validation responses differ, or not in the same order"
            elif key.startswith(VAL_PREFIX):
                binding, why = step in val_same, "validation responses differ or were not dumped"
            else:
                binding, why = first_flip is None or step < first_flip, f"after the rollout flip at step {first_flip}"
            (failed if binding else excused).append((step, key, a, b, why))
    if failed:
        shown = "; ".join(f"step {s} {k}: campaign {a!r} vs uninterrupted {b!r}" for s, k, a, b, _ in failed[:10])
        raise AssertionError(f"{len(failed)} metrics beyond {METRIC_TOL} where the runs' responses agree: {shown}")
    top = sorted(worst.items(), key=lambda kv: -kv[1])
    return {
        "compared_keys": len(worst),
        "exact_keys": sum(v == 0.0 for v in worst.values()),
        "max_abs_diff": dict(top[:10]),
        "training_steps_bound": [s for s in steps if first_flip is None or s < first_flip],
        "val_steps_bound": sorted(val_same & set(steps)),
        "val_bootstrap_steps_bound": sorted(val_in_order & set(steps)),
        "beyond_tolerance": [f"step {s} {k} ({why})" for s, k, _, _, why in excused],
    }


def responses(lines: Iterable[str]) -> list[tuple[str, str]]:
    """The sorted (input, output) pairs of a rollout or validation dump (its order is the finishing order)."""
    return sorted((entry["input"], entry["output"]) for entry in map(json.loads, lines))


def response_flips(camp_lines: Iterable[str], ref_lines: Iterable[str]) -> list[dict[str, Any]]:
    """Per input of one step, the outputs only the campaign gave and those only the reference gave (empty: same)."""
    camp, ref = Counter(responses(camp_lines)), Counter(responses(ref_lines))
    found: dict[str, dict[str, list[str]]] = {}
    for side, extra in (("campaign", camp - ref), ("uninterrupted", ref - camp)):
        for (text, output), count in sorted(extra.items()):
            found.setdefault(text, {"campaign": [], "uninterrupted": []})[side] += [output] * count
    return [{"input": text, **outputs} for text, outputs in sorted(found.items())]


def check_leaks(runs: list[tuple[str, dict[str, Any] | None]]) -> None:
    """Each (name, leak record): its trainer and a Ray process seen while it lived, nothing with the tag left after."""
    for name, leak in runs:
        if leak is None:
            raise AssertionError(f"{name}: no tag-based leak count (the report predates it): nothing proves its "
                                 "processes were seen, so 'none left' proves nothing")  # fmt: skip
        if not leak["trainer_seen"] or leak["ray_seen"] < 1:
            raise AssertionError(f"{name}: the tag scan saw {leak['ray_seen']} Ray processes and "
                                 f"{'' if leak['trainer_seen'] else 'not '}its trainer (pid {leak['trainer']}) "
                                 "while it ran: a count of none left would prove nothing")  # fmt: skip
        if leak["left"]:
            raise AssertionError(f"{name}: {len(leak['left'])} tagged processes left after it: {leak['left']}")
