"""Issue 52's study (``--preset why``): the plan page's predictions unchanged since its commit, the plan's size and
seeds, the memory rule's power, the statistics against independent computations, and (slow tier) the tiny variant's
page and per-prompt file checked against its per-seed numbers."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from ebpo_verl.study import why, why_page
from ebpo_verl.study.why import FIXED_S, PLANS

ROOT = Path(__file__).resolve().parents[1]
PLAN_PAGE = ROOT / "docs" / "study_why_PLAN.md"
PLAN_COMMIT = "1f33a3b"
"""The commit that first had the plan page; the long run is pinned at it (docs/study_why_PLAN.md)."""
SECTIONS_SHA256 = {
    "predictions": "101633d131796a0441753f2b7f0185d552dde06ad17836b684208fffd4df75a1",
    "primary": "2d0df8992c58ff51dcddae6a16489a496a8ef34015e0f8dcc7245967ed2e950f",
}
FULL = PLANS["why"]


def section(text: str, name: str) -> str:
    # the plan commit's markers were "<!-- NAME:begin -->"; today's "<!-- NAME begin -->" (no generated-block look)
    match = re.search(rf"<!-- {name}[: ]begin -->\n(.*?)<!-- {name}[: ]end -->", text, re.S)
    assert match, f"no {name} section"
    return match.group(1)


@pytest.mark.parametrize("name", sorted(SECTIONS_SHA256))
def test_the_predictions_and_primary_tests_are_unchanged_since_the_plan_commit(name):
    now = section(PLAN_PAGE.read_text(), name)
    assert hashlib.sha256(now.encode()).hexdigest() == SECTIONS_SHA256[name]
    shown = subprocess.run(["git", "show", f"{PLAN_COMMIT}:docs/study_why_PLAN.md"], cwd=ROOT, capture_output=True,
                           text=True)  # fmt: skip
    if shown.returncode == 0:  # a clone with history (CI's): the plan commit's own copy
        assert section(shown.stdout, name) == now


def test_the_plan_counts_its_runs_within_1500_and_matches_its_page():
    # by hand (the page's Size paragraph): 33 tuned slots x 3 rates x 4 seeds; tests at the caps: 3 dose cells x 10
    # arms x 16 + ebpo_batch, ebpo_decay095 x 16 in dose_current_g16; memory_g16 to 48 seeds (3 arms, 16 shared);
    # memory_g8 3 x 64; warm starts 4 x 4 arms x 2 G x 8 less w0's 3 shared arms at G = 2
    tuning = (7 + 7 + 12 + 3 + 4) * 3 * 4
    test = 3 * 10 * 16 + 2 * 16 + 3 * (48 - 16) + 3 * 64 + (4 * 4 * 2 * 8 - 3 * 8)
    assert (tuning, test) == (396, 1032)
    assert len(FULL.tuned_slots()) == 33 and FULL.planned_runs() == tuning + test <= FULL.run_cap == 1500
    assert "1,032" in PLAN_PAGE.read_text() and "396 runs" in PLAN_PAGE.read_text()


def test_seeds_are_fresh_and_rates_reused_are_rivals2s():
    top = max(c.max_seeds or c.seeds for c in FULL.cells)
    test_seeds = set(range(FULL.seed0, FULL.seed0 + top))
    assert not test_seeds & set(range(16)) and not test_seeds & set(range(1000, 1004))
    assert not test_seeds & set(FULL.tuning_seeds) and set(FULL.tuning_seeds).isdisjoint(range(1000, 1004))
    rivals2 = json.loads((ROOT / "docs" / "study_rivals2" / "summary.json").read_text())
    for cell in FULL.cells:
        for arm, lr in cell.reused.items():
            assert rivals2["regimes"][cell.mix]["lr_used"][arm][str(cell.group_size)] == lr
            assert cell.responses == rivals2["responses_per_step"]


@pytest.mark.parametrize("sd", [0.004, 0.007, 0.014])
def test_the_memory_rule_reaches_80_percent_power_by_the_noncentral_t(sd):
    n = why.seeds_needed(sd, 8, 200, 0.004)
    crit = lambda m: stats.t.ppf(0.975, m - 1)  # noqa: E731  one-sided 0.025
    power = lambda m: 1 - stats.nct.cdf(crit(m), m - 1, 0.004 * math.sqrt(m) / sd)  # noqa: E731
    assert power(n) >= 0.79  # the (t + t) formula is the usual approximation of the exact noncentral-t power
    assert n == 8 or power(n - 1) < 0.82
    assert why.seeds_needed(sd, 8, 10, 0.0001) == 10  # capped


def test_trend_and_families_against_hand_computation():
    rng = np.random.default_rng(0)
    final = {a: {s: 0.3 + 0.02 * S + rng.normal(0, 0.01) for s in range(6)} for a, S in FIXED_S.items()}
    xs = np.asarray(list(FIXED_S.values()))
    by_hand = []
    for s in range(6):
        ys = np.asarray([final[a][s] for a in FIXED_S])
        by_hand.append(((xs - xs.mean()) * (ys - ys.mean())).sum() / ((xs - xs.mean()) ** 2).sum())
    assert np.allclose(why.slopes(final), by_hand, rtol=0, atol=1e-12)
    recs = why.family([why.test_record([0.01, 0.02, 0.03, 0.015], test="a"),
                       why.test_record([0.001, -0.002, 0.0, 0.001], test="b"),
                       why.test_record([0.01, 0.012, 0.011, 0.013], "greater", test="c")])  # fmt: skip
    p = [stats.ttest_1samp(x, 0).pvalue for x in ([0.01, 0.02, 0.03, 0.015], [0.001, -0.002, 0.0, 0.001])]
    p.append(stats.ttest_1samp([0.01, 0.012, 0.011, 0.013], 0, alternative="greater").pvalue)
    order = np.argsort(p)
    adjusted = np.maximum.accumulate([min(1, (3 - k) * p[i]) for k, i in enumerate(order)])
    assert np.allclose([recs[i]["p_holm"] for i in order], adjusted)
    for r, raw in zip(recs, p, strict=True):
        assert math.isclose(r["p"], raw) and (r["holm"] == "not separated from") == (r["p_holm"] > 0.05)


# ----------------------------------------------------------------------------------------------- a study's output


def recompute(data: dict) -> None:
    """Every family's record recomputed from the per-seed finals with scipy and a direct Holm."""
    final = data["final"]
    for name, recs in data["families"].items():
        xs = []
        for r in recs:
            cell = final[r["cell"]]
            if r["test"] == "trend":
                f = cell["0"]
                seeds = sorted(set.intersection(*(set(f[a]) for a in FIXED_S)))
                s_values = np.asarray(list(FIXED_S.values()))
                x = [np.polyfit(s_values, [f[a][k] for a in FIXED_S], 1)[0] for k in seeds]
            elif r["test"] == "warm":
                x = [np.mean([v - w[r["b"]][s] for s, v in w["ebpo"].items()]) for w in cell.values() if w]
            else:
                f = cell["0"]
                x = [f[r["a"]][s] - f[r["b"]][s] for s in f[r["a"]] if s in f[r["b"]]]
            alt = r["alternative"]
            p = stats.ttest_1samp(x, 0, alternative=alt).pvalue if np.std(x) > 0 else r["p"]
            assert math.isclose(r["mean"], float(np.mean(x)), abs_tol=1e-12) and math.isclose(r["p"], p, abs_tol=1e-9)
            xs.append(p)
        order = np.argsort(xs, kind="stable")
        adjusted = np.maximum.accumulate([min(1, (len(xs) - k) * xs[i]) for k, i in enumerate(order)])
        for k, i in enumerate(order):
            assert math.isclose(recs[i]["p_holm"], adjusted[k], abs_tol=1e-9), (name, recs[i])


def check_page(data: dict, text: str) -> None:
    """Each primary test's line names its family and size, its mean and adjusted p as recomputed, and its verdict."""
    recompute(data)
    for name, label in (("dose", "dose"), ("memory", "memory"), ("warm", "warm-start")):
        recs = data["families"][name]
        for r in recs:
            line = next(ln for ln in text.splitlines() if ln.startswith(f"- {r['cell']}, ")
                        and f"adjusted p = {r['p_holm']:.4f}" in ln and f"{r['mean']:+.4f}" in ln)  # fmt: skip
            assert f"Holm over the {label} family of {len(recs)}" in line
            # the verdict from the recomputed adjusted p (a one-sided test is never "below 0")
            word = "not separated from 0" if r["p_holm"] > 0.05 else "above 0" if r["mean"] > 0 else "below 0"
            assert line.endswith(f": {word}.") or f": {word}. Detectable" in line


def stratified_from_npz(path: Path, cell_arms: tuple[str, str], key: str = "current-w0") -> float:
    """ebpo - grpo in the mean gain on seen RL prompts the warm start solved below 0.05, over shared seeds, read
    from the per-prompt file alone."""
    z = np.load(path)
    start = z[f"{key}/train_start"].astype(float)
    runs = [tuple(r) for r in json.loads(str(z[f"{key}/runs"]))]
    end, seen = z[f"{key}/train_end"].astype(float), np.unpackbits(z[f"{key}/seen"], axis=1)[:, : len(start)] > 0
    gain = {}
    for i, (arm, g, seed) in enumerate(runs):
        if g == 2 and arm in cell_arms:
            mask = seen[i] & (start < 0.05)
            gain.setdefault(arm, {})[seed] = float((end[i] - start)[mask].mean())
    a, b = cell_arms
    return float(np.mean([gain[a][s] - gain[b][s] for s in gain[a] if s in gain[b]]))


@pytest.mark.slow
def test_tiny_variant_page_agrees_with_its_json_per_prompt_file_resumes_and_reports(tmp_path):
    from ebpo_verl.study.__main__ import main

    out = tmp_path / "why"
    assert main(["--preset", "why_tiny", "--out", str(out)]) == 0
    data, text = json.loads((out / "summary.json").read_text()), (out / "study.md").read_text()
    check_page(data, text)
    got = stratified_from_npz(out / "per_prompt.npz", ("ebpo", "grpo"))
    want = data["stratified"]["dose_current_g2"]["ebpo"]["below"]["mean"]
    assert math.isclose(got, want, abs_tol=2e-3)  # float16 per-prompt rates: ~1e-3 of rounding
    assert main(["--preset", "why_tiny", "--out", str(out)]) == 0  # resumes: nothing reruns, the same numbers
    again = json.loads((out / "summary.json").read_text())
    assert again["families"] == data["families"] and again["final"] == data["final"]
    # the report without training: the whole study as the study wrote it; a partial one up to its first cell whose
    # tuning is not all saved; nothing written into the study's folder
    files = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert main(["report", "--study", str(out), "--out", str(tmp_path / "r1")]) == 0
    assert json.loads((tmp_path / "r1" / "summary.json").read_text())["families"] == data["families"]
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == files
    next((out / "hard-w0" / "runs").glob("ebpo_s1-g2-random-s2000*")).unlink()
    (out / "current-w0" / "runs" / "grpo-g2-random-s201.json").unlink()
    files = {p: p.stat().st_mtime_ns for p in out.rglob("*")}  # the deletions touched their folders
    assert main(["report", "--study", str(out), "--out", str(tmp_path / "r2")]) == 0
    partial = json.loads((tmp_path / "r2" / "summary.json").read_text())
    assert (
        list(partial["cells"]) == ["dose_current_g2"] and "202" not in partial["final"]["dose_current_g2"]["0"]["grpo"]
    )
    check_page(partial, (tmp_path / "r2" / "study.md").read_text())
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == files


def test_a_wrong_page_line_is_caught():
    data = {"final": {"c": {"0": {"ebpo": {200: 0.5, 201: 0.52, 202: 0.49}, "ebpo_batch": {200: 0.49, 201: 0.5,
                                                                                           202: 0.5}}}},
            "families": {"dose": [], "warm": []}}  # fmt: skip
    x = [0.01, 0.02, -0.01]
    data["families"]["memory"] = why.family([why.test_record(x, "greater", test="memory", cell="c", a="ebpo",
                                                             b="ebpo_batch")])  # fmt: skip
    data["families"]["memory"][0]["mde"] = 0.01
    text = "\n".join(why_page.family_lines(data["families"]["memory"], "memory"))
    check_page(data, text)
    with pytest.raises(StopIteration):
        check_page(data, text.replace("adjusted p", "p-adjusted"))
    data["families"]["memory"][0]["p_holm"] = 0.001
    with pytest.raises(AssertionError):
        recompute(data)


def test_a_plan_that_breaks_a_rule_is_refused_naming_it():
    """WhyPlan's rules (the shared TunedPlan checks: estimators, its own rules, the run cap), one message each."""
    cell = FULL.cells[0]
    cases = {
        "unknown estimators ['nope']": (dataclasses.replace(cell, arms=("grpo", "nope")),),
        "cells at current G=2 differ in responses a step": (cell, dataclasses.replace(cell, name="b", responses=64)),
        "test seeds must start at 16 or later": (dataclasses.replace(cell, seeds=5000),),
    }
    for message, cells in cases.items():
        with pytest.raises(ValueError, match=re.escape(f"plan x: {message}")):
            why.WhyPlan(name="x", scale=FULL.scale, cells=cells)
    with pytest.raises(ValueError, match=r"plan x: \d+ runs exceed run_cap 10"):
        why.WhyPlan(name="x", scale=FULL.scale, cells=(cell,), run_cap=10)
