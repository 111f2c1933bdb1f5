"""Issue 47's study (``--preset rivals2``): its size, its seeds, its learning-rate choice, Holm's procedure, and
that every verdict sentence of its page agrees with separation recomputed from its JSON's per-seed numbers."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from ebpo_verl.study import rivals2
from ebpo_verl.study.presets import PRESETS
from ebpo_verl.study.rivals2 import PLANS, Plan, Regime

FULL = PLANS["rivals2"]


def test_full_plan_counts_its_runs_and_stays_within_2500():
    # by hand: per regime the top group's tuning (8 estimators x G = 2, 8 x 3 rates x 4 seeds) and tests
    # (8 x G = 2, 4, 8, 16 x 16 seeds); the first regime adds the 6 others (tuning alike, tests G = 2, 4, 8 x 6 seeds)
    by_hand = 3 * (8 * 2 * 3 * 4 + 8 * 4 * 16) + 6 * 2 * 3 * 4 + 6 * 3 * 6
    assert by_hand == 2364
    assert FULL.planned_runs() == by_hand
    assert FULL.run_cap <= 2500


def test_grid_extensions_never_take_the_study_past_its_cap(monkeypatch):
    """The worst case: every choice at the grid's high edge, every round. The fake runs score a rate by itself."""
    calls = []

    def fake_run_grid(preset, base, out, jobs, workers=None, train=True):
        calls.append(len(jobs))
        runs = [
            {
                "config": {"estimator": j.estimator, "group_size": j.group_size, "lr": j.lr, "seed": j.seed},
                "metrics": {"accuracy": [0.0, j.lr]},
                "seconds": 1.0,
            }
            for j in jobs
        ]
        return runs, 0

    monkeypatch.setattr("ebpo_verl.study.runner.run_grid", fake_run_grid)
    room, total = FULL.run_cap - FULL.planned_runs(), 0
    for regime in FULL.regimes:
        choices, room, runs = rivals2.tune(FULL, regime, None, None, room, None)
        lrs = rivals2.rates_used(FULL, regime, choices)
        total += len(runs) + len(FULL.test_jobs(regime, lrs))
        assert all(c["chosen"] == max(c["values"]) for c in choices.values())
    assert room >= 0 and total <= FULL.run_cap
    assert total > FULL.run_cap - FULL.tune_seeds  # the room was used up: the cap, not the rule, stopped it
    first = next(iter(FULL.regimes))
    choices, _, _ = rivals2.tune(FULL, first, None, None, 10**6, None)
    assert {len(c["values"]) for c in choices.values()} == {len(FULL.lr_grid) + FULL.max_extensions}


def test_tuning_and_test_seeds_are_disjoint_and_enough():
    assert len(FULL.tuning_seeds) >= 4 and FULL.top_seeds >= 16 and FULL.rest_seeds >= 6
    jobs = [j for r in FULL.regimes for j in FULL.tuning_jobs({s: list(FULL.lr_grid) for s in FULL.slots(r)})]
    lrs = {e: dict.fromkeys((2, 4, 8, 16), 1e-4) for e in (*FULL.top, *FULL.rest)}
    tests = [j for r in FULL.regimes for j in FULL.test_jobs(r, lrs)]
    assert {j.split for j in jobs} == {"validation"} and {j.split for j in tests} == {"test"}
    assert not {j.seed for j in jobs} & {j.seed for j in tests}
    top = [j for j in tests if j.estimator in FULL.top]
    for r in FULL.regimes:  # the same 8 at every G in every regime, 128 responses per step
        assert {(j.estimator, j.group_size) for j in FULL.test_jobs(r, lrs) if j.estimator in FULL.top} == {
            (e, g) for e in rivals2.TOP_GROUP for g in (2, 4, 8, 16)
        }
    assert {j.responses_per_step for j in top} == {128}
    assert {"ha_dw", "ha_dw_authors", "ebpo_batch"} <= {j.estimator for j in tests}
    with pytest.raises(ValueError, match="overlaps the test seeds"):
        Plan(name="x", scale=PRESETS["tiny"], tune_seed0=10)


def test_untuned_g_takes_the_nearest_tuned_one():
    assert [FULL.nearest_tuned(g) for g in (2, 4, 8, 16)] == [2, 2, 8, 8]


def test_lr_choice_neighbours_and_edges():
    scores = {1e-4: {0: 0.30, 1: 0.32, 2: 0.31}, 2e-4: {0: 0.40, 1: 0.41, 2: 0.42}, 4e-4: {0: 0.35, 1: 0.36, 2: 0.37}}
    c = rivals2.lr_choice(scores)
    assert c["chosen"] == 2e-4 and c["edge"] is None and c["separated"]
    assert [v["diff"][0] for v in c["vs_neighbours"]] == pytest.approx([0.1, 0.05])
    noisy = {1e-4: {0: 0.30, 1: 0.50}, 2e-4: {0: 0.45, 1: 0.40}}  # 2e-4 - 1e-4 = +0.15, -0.10: covers 0
    c = rivals2.lr_choice(noisy)
    assert c["chosen"] == 2e-4 and c["edge"] == "high" and not c["separated"]
    tie = rivals2.lr_choice({1e-4: {0: 0.3}, 2e-4: {0: 0.3}})
    assert tie["chosen"] == 1e-4 and tie["edge"] == "low"
    rates = {("a", 2): [1e-4, 2e-4], ("b", 2): [1e-4, 2e-4], ("c", 2): [1e-4, 2e-4, 4e-4]}
    choices = {
        ("a", 2): {"edge": "low", "chosen": 1e-4},
        ("b", 2): {"edge": None, "chosen": 2e-4},
        ("c", 2): {"edge": "high", "chosen": 4e-4},
    }
    assert rivals2.extensions(choices, rates, (1e-4, 2e-4), 1, 100, 4) == [(("a", 2), 5e-5)]  # c: used its one
    assert rivals2.extensions(choices, rates, (1e-4, 2e-4), 2, 100, 4) == [(("a", 2), 5e-5), (("c", 2), 8e-4)]
    assert rivals2.extensions(choices, rates, (1e-4, 2e-4), 2, 7, 4) == [(("a", 2), 5e-5)]  # room for one


def test_holm_against_a_hand_computed_case():
    # sorted p: 0.005 (x4 = 0.02, <= 0.0125: rejected), 0.01 (x3 = 0.03, <= 0.0167: rejected),
    # 0.03 (x2 = 0.06 > 0.025: Holm stops), 0.04 (x1, but monotone: 0.06)
    adjusted, levels = rivals2.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert levels == pytest.approx([0.05 / 3, 0.025, 0.025, 0.0125])
    # the case where a later p is below its own Bonferroni-Holm bound but Holm has stopped: not rejected
    adjusted, levels = rivals2.holm([0.03, 0.04])
    assert adjusted == pytest.approx([0.06, 0.06]) and levels == pytest.approx([0.025, 0.025])


def test_holm_intervals_exclude_zero_exactly_where_holm_rejects():
    rng = np.random.default_rng(0)
    for _ in range(30):
        names = tuple("abcdefgh")
        shift = rng.normal(0, 0.01, len(names))
        final = {e: {s: shift[i] + rng.normal(0, 0.01) for s in range(16)} for i, e in enumerate(names)}
        recs = rivals2.pairs(final, names)
        assert len(recs) == 28
        rejected = _holm_rejects([r["p"] for r in recs])
        for r, rej in zip(recs, rejected, strict=True):
            assert (r["holm"] != "not separated from") == rej
            assert r["holm_half"] >= r["half"]


def _holm_rejects(p: list[float], alpha: float = 0.05) -> list[bool]:
    """Holm 1979 directly: reject the i-th smallest p while every p up to it is <= alpha / (m - rank)."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    out, going = [False] * len(p), True
    for rank, i in enumerate(order):
        going = going and p[i] <= alpha / (len(p) - rank)
        out[i] = going
    return out


LINE = re.compile(r"^- Regime (\w+), G=(\d+), (plain|Holm-adjusted) 95%: (.*)\.$")
CLAUSE = re.compile(r"(\w+) is (ahead of|behind|not separated from) (\w+) \(")


def _recomputed(final: dict, a: str, b: str, g: str, holm_over: list[tuple[str, str]]) -> tuple[str, str]:
    """Plain and Holm verdicts of a - b at G from the per-seed values, by scipy's t-interval and a direct Holm."""

    def diff(x, y):
        seeds = sorted(set(final[x][g]) & set(final[y][g]))
        return np.asarray([final[x][g][s] - final[y][g][s] for s in seeds])

    d = diff(a, b)
    half = stats.t.ppf(0.975, len(d) - 1) * stats.sem(d)  # a zero spread: a zero-width interval, p 0 (or 1 at 0)
    plain = "ahead of" if d.mean() - half > 0 else "behind" if d.mean() + half < 0 else "not separated from"
    ps = []
    for x, y in holm_over:
        dd = diff(x, y)
        ps.append(stats.ttest_1samp(dd, 0).pvalue if np.ptp(dd) > 0 else float(dd.mean() == 0))
    rejected = dict(zip(holm_over, _holm_rejects(ps), strict=True))
    key = (a, b) if (a, b) in rejected else (b, a)
    holm = ("ahead of" if d.mean() > 0 else "behind") if rejected[key] else "not separated from"
    return plain, holm


def check_page_against_json(text: str, data: dict) -> int:
    """Every verdict clause of ``text`` against the verdict recomputed from ``data``; returns how many were checked."""
    top = data["top_group"]
    checked = 0
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        regime, g, kind, body = m.groups()
        final = data["regimes"][regime]["final"]
        have = [e for e in top if g in final.get(e, {})]
        holm_over = list(itertools.combinations(have, 2))
        clauses = CLAUSE.findall(body)
        assert clauses, line
        for a, said, b in clauses:
            plain, holm = _recomputed(final, a, b, g, holm_over)
            assert said == (plain if kind == "plain" else holm), (line, a, b)
            checked += 1
        if "winner" in body or "none separated" in body:
            won = _undominated(final, have, g, holm_over)
            assert ("separated winner:" in body) == (len(won) == 1), line
            assert (f"separated winner: {won[0]};" if len(won) == 1 else f"ahead of: {', '.join(won)})") in body
    return checked


def _undominated(final, have, g, holm_over) -> list[str]:
    beaten = set()
    for x, y in holm_over:
        h = _recomputed(final, x, y, g, holm_over)[1]
        if h != "not separated from":
            beaten.add(y if h == "ahead of" else x)
    return [e for e in have if e not in beaten]


def _synthetic_data() -> dict:
    """A study's JSON from made-up per-seed numbers with clear gaps (ebpo and spo ahead, grpo behind) and noise."""
    plan = FULL
    rng = np.random.default_rng(1)
    level = dict(zip(plan.top, (0.50, 0.49, 0.50, 0.48, 0.49, 0.47, 0.47, 0.44), strict=True))
    results = {}
    for regime in plan.regimes[:2]:
        runs = [
            {
                "config": {"estimator": e, "group_size": g, "seed": s, "order": "random"},
                "metrics": {"accuracy": [0.3, level[e] + rng.normal(0, 0.01)]},
                "seconds": 1.0,
            }
            for e in plan.top
            for g in plan.top_gs
            for s in range(plan.top_seeds)
        ]
        scores = {
            (e, g): {lr: {s: rng.normal(lr * 1e3, 0.01) for s in plan.tuning_seeds} for lr in plan.lr_grid}
            for e in plan.top
            for g in plan.tune_gs
        }
        choices = {slot: {**rivals2.lr_choice(v), "extended": 0} for slot, v in scores.items()}
        info = {
            "pass_rate_histogram": [1] * 10,
            "frac_train_below_0.05": 0.3,
            "frac_train_above_0.95": 0.1,
            "heldout_accuracy": 0.3,
        }
        reg = Regime(regime.name, with_rest=False)
        results[regime.name] = rivals2.regime_summary(
            plan, reg, info, choices, rivals2.rates_used(plan, reg, choices), runs
        )
    return rivals2.study_data(plan, results, "synthetic", 1.0, 1, 1, 1.0)


def test_every_verdict_sentence_agrees_with_the_json_synthetic():
    data = json.loads(json.dumps(_synthetic_data()))  # as read back from summary.json
    text = rivals2.page(data)
    assert check_page_against_json(text, data) == 2 * 4 * (2 * 28 + 3)  # regimes x G x (two lines + the note)
    said = set(CLAUSE.findall(text))
    assert {s for _, s, _ in said} == {"ahead of", "behind", "not separated from"}  # every kind is checked
    assert "separated winner" in text or "none separated" in text


def test_a_wrong_sentence_is_caught():
    data = json.loads(json.dumps(_synthetic_data()))
    text = rivals2.page(data)
    bad = text.replace("ebpo is ahead of grpo", "ebpo is not separated from grpo", 1)
    assert bad != text
    with pytest.raises(AssertionError):
        check_page_against_json(bad, data)


@pytest.mark.slow
def test_tiny_variant_end_to_end_page_agrees_with_its_json_and_resumes(tmp_path):
    out = tmp_path / "r2"
    cmd = [sys.executable, "-m", "ebpo_verl.study", "--preset", "rivals2_tiny", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    data = json.loads((out / "summary.json").read_text())
    text = (out / "study.md").read_text()
    plan = PLANS["rivals2_tiny"]
    assert check_page_against_json(text, data) == 3 * 4 * (2 * 3 + 2)
    assert not set(data["tuning_seeds"]) & {*data["test_seeds"]["top"], *data["test_seeds"]["rest"]}
    for reg in data["regimes"].values():  # the runs' own seeds are the lists' seeds
        seeds = {int(s) for e in reg["final"].values() for g in e.values() for s in g}
        assert seeds <= set(data["test_seeds"]["top"])
        for slot, c in reg["tuning"].items():  # the tiny grid has 2 rates: every first choice is at an edge
            assert c["extended"] == 1 and len(c["values"]) == 3, slot
    files = sorted(p.name for p in (out / "current" / "runs").iterdir())
    tuning_seeds = {int(re.search(r"-s(\d+)-lr", f)[1]) for f in files if "validation" in f}
    test_seeds = {int(re.search(r"-s(\d+)\.json", f)[1]) for f in files if "validation" not in f}
    assert tuning_seeds == set(data["tuning_seeds"]) and not tuning_seeds & test_seeds
    assert data["n_runs"]["tuning"] + data["n_runs"]["test"] <= plan.run_cap
    assert (out / "regimes.png").is_file() and (out / "histograms.png").is_file()
    before = (out / "summary.json").read_text()
    again = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    assert "resuming" in again.stdout
    strip = re.compile(r'"(wall_seconds|run_seconds|started|provenance)".*')
    assert strip.sub("", (out / "summary.json").read_text()) == strip.sub("", before)


COMMITTED = Path(__file__).resolve().parents[1] / "docs" / "study_rivals2"


def test_the_committed_page_agrees_with_its_json_and_its_seeds_are_disjoint():
    """docs/study_rivals2/ as the full run wrote it: every verdict sentence recomputed from its JSON (3 regimes x
    4 G x (the 28 top-group pairs on two lines + the note)); tuning seeds disjoint from test seeds; each result's
    seed one of the listed test seeds."""
    data = json.loads((COMMITTED / "summary.json").read_text())
    assert check_page_against_json((COMMITTED / "study.md").read_text(), data) == 3 * 4 * (2 * 28 + 3)
    top, rest = set(data["test_seeds"]["top"]), set(data["test_seeds"]["rest"])
    assert len(data["tuning_seeds"]) >= 4 and len(top) >= 16 and len(rest) >= 6
    assert not set(data["tuning_seeds"]) & (top | rest)
    for reg in data["regimes"].values():
        assert {int(s) for e in reg["final"].values() for g in e.values() for s in g} <= top | rest


def test_the_readmes_rivals2_sentence_holds_in_the_committed_json():
    """README: at G = 2, in every regime, ebpo is ahead of grpo and behind running_norm under Holm and not separated
    from ebpo_batch at any G; most gaps (of those three pairs) are below the cross-machine spread. Recomputed from
    the per-seed values, not read from the stored verdicts."""
    readme = " ".join((COMMITTED.parents[1] / "README.md").read_text().split())
    assert "at G = 2 EBPO is ahead of GRPO and behind running norm (Holm-adjusted) in all three regimes" in readme
    assert "never separated from `ebpo_batch`" in readme and "most gaps are below 0.015" in readme
    data = json.loads((COMMITTED / "summary.json").read_text())
    assert len(data["regimes"]) == 3
    gaps = []
    for reg in data["regimes"].values():
        final = reg["final"]
        for g in map(str, data["group_sizes"]):
            holm_over = list(itertools.combinations([e for e in data["top_group"] if g in final[e]], 2))
            said = {b: _recomputed(final, "ebpo", b, g, holm_over)[1] for b in ("grpo", "running_norm", "ebpo_batch")}
            assert said["ebpo_batch"] == "not separated from", g
            if g == "2":
                assert said["grpo"] == "ahead of" and said["running_norm"] == "behind"
            gaps += [abs(np.mean([final["ebpo"][g][s] - final[b][g][s] for s in final["ebpo"][g]])) for b in said]
    assert sum(gap < data["cross_machine_spread"] for gap in gaps) > len(gaps) / 2
