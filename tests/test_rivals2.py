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


LINE = re.compile(r"^- Regime (\w+), G=(\d+), (plain 95%|Holm-adjusted 95% over the cell's (\d+) pairs): (.*)\.$")
CLAUSE = re.compile(r"(\w+) is (ahead of|behind|not separated from) (\w+) \(")
BOUND = re.compile(
    r"(\w+) is not separated from (\w+) \([^()]*?; 95% upper bound ([+-]\d\.\d{4})(?:, (ahead of|behind) \w+ in the "
    r"plain interval)?; detectable at 80% power: (\d\.\d{4})\)"
)


def _diff(final: dict, a: str, b: str, g: str) -> np.ndarray:
    seeds = sorted(set(final[a][g]) & set(final[b][g]))
    return np.asarray([final[a][g][s] - final[b][g][s] for s in seeds])


def _plain(d: np.ndarray) -> tuple[str, float]:
    """The plain verdict and the 95% upper bound of a paired difference, by scipy's t-interval."""
    half = stats.t.ppf(0.975, len(d) - 1) * stats.sem(d)  # a zero spread: a zero-width interval
    return ("ahead of" if d.mean() - half > 0 else "behind" if d.mean() + half < 0 else "not separated from"), float(
        d.mean() + half
    )


def _recomputed(final: dict, a: str, b: str, g: str, holm_over: list[tuple[str, str]]) -> tuple[str, str]:
    """Plain and Holm verdicts of a - b at G from the per-seed values, by scipy's t-interval and a direct Holm."""
    d = _diff(final, a, b, g)
    ps = []
    for x, y in holm_over:
        dd = _diff(final, x, y, g)
        ps.append(stats.ttest_1samp(dd, 0).pvalue if np.ptp(dd) > 0 else float(dd.mean() == 0))
    rejected = dict(zip(holm_over, _holm_rejects(ps), strict=True))
    key = (a, b) if (a, b) in rejected else (b, a)
    holm = ("ahead of" if d.mean() > 0 else "behind") if rejected[key] else "not separated from"
    return _plain(d)[0], holm


def _check_bounds(body: str, final: dict, g: str) -> int:
    """Each "not separated" clause of a closing-note line states its plain 95% upper bound, the plain verdict where
    that interval excludes 0, and (t_0.975 + t_0.8) sd / sqrt(n), all recomputed from the per-seed values."""
    bounds = BOUND.findall(body)
    assert len(bounds) == body.count(" is not separated from "), body
    for a, b, upper, plain_said, detectable in bounds:
        d = _diff(final, a, b, g)
        plain, up = _plain(d)
        df = len(d) - 1
        assert upper == f"{up:+.4f}" and (plain_said or "not separated from") == plain, (a, b, g)
        assert detectable == f"{(stats.t.ppf(0.975, df) + stats.t.ppf(0.8, df)) * d.std(ddof=1) / np.sqrt(df + 1):.4f}"
    return len(bounds)


def check_page_against_json(text: str, data: dict) -> int:
    """Every verdict clause of ``text`` against the verdict recomputed from ``data`` (a Holm line's family: its
    cell's pairs; a closing-note line's bounds: :func:`_check_bounds`); returns how many clauses were checked."""
    top = data["top_group"]
    checked = 0
    assert "cross-machine spread" not in text  # a cell-mean shift, not a paired quantity: no verdict uses it
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        regime, g, label, family, body = m.groups()
        final = data["regimes"][regime]["final"]
        have = [e for e in top if g in final.get(e, {})]
        holm_over = list(itertools.combinations(have, 2))
        assert family is None or int(family) == len(holm_over), line
        clauses = CLAUSE.findall(body)
        assert clauses, line
        for a, said, b in clauses:
            plain, holm = _recomputed(final, a, b, g, holm_over)
            assert said == (plain if family is None else holm), (line, a, b)
            checked += 1
        if "winner" in body or "none separated" in body:
            _check_bounds(body, final, g)
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


def test_mde_against_hand_numbers_and_the_noncentral_t_power():
    # by hand: t_0.975,15 = 2.1314, t_0.8,15 = 0.8662; (2.1314 + 0.8662) * 0.0131 / 4 = 0.009817
    assert rivals2.mde(0.0131, 16) == pytest.approx(0.009817, abs=2e-6)
    assert rivals2.mde(0.0, 16) == 0.0
    for n, sd in ((16, 0.01), (8, 0.02), (40, 0.003)):  # the two-sided test's power at the MDE: about 0.8
        df, shift = n - 1, rivals2.mde(sd, n) / (sd / np.sqrt(n))
        crit = stats.t.ppf(0.975, df)
        power = stats.nct.sf(crit, df, shift) + stats.nct.cdf(-crit, df, shift)
        assert 0.78 < power < 0.81, (n, power)
    for bad in ((0.01, 1), (-0.01, 16), (float("nan"), 16)):
        with pytest.raises(ValueError, match="mde: needs n >= 2"):
            rivals2.mde(*bad)


def test_the_committed_page_states_bounds_and_detectable_effects():
    """Every "not separated" clause of the closing note carries its bound and detectable effect (checked in
    :func:`check_page_against_json`); here: they are there, and a wrong bound, effect, family or plain verdict fails."""
    data = json.loads((COMMITTED / "summary.json").read_text())
    text = (COMMITTED / "study.md").read_text()
    assert text == rivals2.page(data)  # the committed page is the code's page of the committed JSON
    note = text[text.index("## Closing note") :]
    # 12 cells x 3 (ebpo against ebpo_batch, grpo, running_norm), less the 9 separated under Holm (ahead of grpo:
    # G = 2 in each regime and hard G = 4; behind running_norm: G = 2 in each regime, easy G = 4 and 8)
    assert sum(_check_bounds(m[5], data["regimes"][m[1]]["final"], m[2]) for m in map(LINE.match, note.splitlines())
               if m) == 36 - 9  # fmt: skip
    for right, wrong in (
        ("95% upper bound +0.0030;", "95% upper bound +0.0031;"),
        ("detectable at 80% power: 0.0098)", "detectable at 80% power: 0.0090)"),
        (
            "Holm-adjusted 95% over the cell's 28 pairs: separated",
            "Holm-adjusted 95% over the cell's 36 pairs: separated",
        ),
        (", behind ebpo_batch in the plain interval", ""),
    ):
        assert right in text
        with pytest.raises(AssertionError):
            check_page_against_json(text.replace(right, wrong, 1), data)


def _holm36(data: dict) -> tuple[dict[tuple[str, str, str], bool], dict[tuple[str, str, str], float]]:
    """Holm over the 36 tests of ebpo against ebpo_batch, grpo and running_norm in every (regime, G) cell."""
    keys = [(r, g, b) for r in data["regimes"] for g in map(str, data["group_sizes"]) for b in rivals2.EBPO_AGAINST]
    ps = [stats.ttest_1samp(_diff(data["regimes"][r]["final"], "ebpo", b, g), 0).pvalue for r, g, b in keys]
    return dict(zip(keys, _holm_rejects(ps), strict=True)), dict(zip(keys, ps, strict=True))


def _cells(data: dict, g: str, other: str) -> list[tuple[str, str, np.ndarray]]:
    """(regime, Holm verdict over the cell's pairs, ebpo - other by seed) per regime at G ``g``."""
    out = []
    for name, reg in data["regimes"].items():
        final = reg["final"]
        over = list(itertools.combinations([e for e in data["top_group"] if g in final[e]], 2))
        out.append((name, _recomputed(final, "ebpo", other, g, over)[1], _diff(final, "ebpo", other, g)))
    return out


def _mde(d: np.ndarray) -> float:
    df = len(d) - 1
    return (stats.t.ppf(0.975, df) + stats.t.ppf(0.8, df)) * d.std(ddof=1) / np.sqrt(len(d))


def check_rivals2_prose(readme: str, rivals: str, data: dict) -> None:
    """The README's and docs/rivals.md's sentences on the rivals2 study, recomputed from the per-seed values (not from
    the stored verdicts): the family each names, the G = 2 verdicts, the bounds and detectable effects, the plain
    exception, the post-hoc G = 16 signs, the wider family's one change and the times (measured vs extrapolated)."""
    readme, rivals = " ".join(readme.split()), " ".join(rivals.split())
    pairs_per_cell = len(list(itertools.combinations(data["top_group"], 2)))
    runs = data["n_runs"]["tuning"] + data["n_runs"]["test"]
    grpo, rn, batch = (_cells(data, "2", b) for b in ("grpo", "running_norm", "ebpo_batch"))
    assert {v for _, v, _ in grpo} == {"ahead of"} and {v for _, v, _ in rn} == {"behind"}
    assert {v for _, v, _ in batch} == {"not separated from"}
    uppers = [_plain(d)[1] for _, _, d in batch]
    mdes = [_mde(d) for _, _, d in batch]
    assert (
        f"{runs:,} runs, {round(data['run_seconds']):,} process-seconds), Holm over each (regime, G) cell's "
        f"{pairs_per_cell} pairs: at G = 2 EBPO is ahead of GRPO and behind running norm in all three regimes; not "
        f"separated from `ebpo_batch` (no cross-step memory): 95% upper bound <= {max(uppers):+.4f}, detectable at "
        f"80% power {min(mdes):.4f}-{max(mdes):.4f}"
    ) in readme
    rate = data["wall_seconds"] * data["workers"] / 742  # the last command ran the easy regime's last 742 runs
    assert (
        f"measured: {round(data['run_seconds']):,} process-seconds of warm starts and runs, `run_seconds` in its "
        f"summary.json, 9.2 h over 2 processes on shared cores; about {runs * rate / data['workers'] / 3600:.1f} h "
        f"on 2 idle cores is an extrapolation from the {rate:.1f} s a run per process of its last 742 runs"
    ) in rivals
    assert f"a family of the {pairs_per_cell} pairs of the top group" in rivals
    up, down = sorted(d.mean() for _, _, d in grpo), sorted(d.mean() for _, _, d in rn)
    assert (
        f"At G = 2 EBPO is ahead of GRPO in every regime ({up[0]:+.4f} to {up[-1]:+.4f}) and behind running_norm "
        f"({down[-1]:+.4f} to {down[0]:+.4f})"
    ) in rivals
    rejected, ps = _holm36(data)
    dropped = [k for k in rejected if k[1] == "2" and k[2] != "ebpo_batch" and not rejected[k]]
    assert dropped == [("hard", "2", "running_norm")]
    assert f"the hard regime's G = 2 loss to running_norm (p = {ps[dropped[0]]:.4f}) is no longer separated" in rivals
    everywhere = [(g, c) for g in map(str, data["group_sizes"]) for c in _cells(data, g, "ebpo_batch")]
    assert {v for _, (_, v, _) in everywhere} == {"not separated from"}
    plain_behind = [(g, name, d) for g, (name, _, d) in everywhere if _plain(d)[0] != "not separated from"]
    assert [(g, name) for g, name, _ in plain_behind] == [("4", "easy")] and _plain(plain_behind[0][2])[0] == "behind"
    d = plain_behind[0][2]
    low = 2 * d.mean() - _plain(d)[1]
    assert f"behind at easy G = 4 ({d.mean():+.4f}, 95% [{low:+.4f}, {_plain(d)[1]:+.4f}])" in rivals
    names = ", ".join(name for name, _, _ in batch)
    assert (
        f"at G = 2 the 95% upper bounds of ebpo - ebpo_batch are {', '.join(f'{u:+.4f}' for u in uppers)} ({names}) "
        f"and the differences detectable at 80% power {', '.join(f'{m:.4f}' for m in mdes)}"
    ) in rivals
    g16 = _cells(data, "16", "ebpo_batch")
    assert all(d.mean() > 0 for _, _, d in g16)
    ts = ", ".join(f"{stats.ttest_1samp(d, 0).statistic:.2f}" for _, _, d in g16)
    assert f"At G = 16 ebpo - ebpo_batch is positive in all three regimes (t = {ts}), a pattern seen after" in rivals
    said = [readme[readme.index("[`rivals2`]") :].split("([more]")[0], rivals.split("- The `rivals2` preset")[1]]
    assert not any("buys nothing" in t or "0.015" in t.split("- `benchmarks")[0] for t in said)


def test_the_readme_and_rivals_page_sentences_hold_in_the_committed_json():
    data = json.loads((COMMITTED / "summary.json").read_text())
    readme, rivals = (
        " ".join(p.read_text().split()) for p in (COMMITTED.parents[1] / "README.md", COMMITTED.parent / "rivals.md")
    )
    check_rivals2_prose(readme, rivals, data)
    for right, wrong in (("+0.0030, +0.0014", "+0.0030, +0.0015"), ("(t = 1.67,", "(t = 1.76,"), ("3.3 h", "3.0 h"),
                         ("(p = 0.0020)", "(p = 0.0200)"), ("[-0.0053, -0.0003]", "[-0.0053, +0.0003]")):  # fmt: skip
        assert right in rivals
        with pytest.raises(AssertionError):
            check_rivals2_prose(readme, rivals.replace(right, wrong, 1), data)
    with pytest.raises(AssertionError):
        check_rivals2_prose(readme.replace("0.0022-0.0098", "0.0022-0.0100"), rivals, data)
