"""The study report's comparisons, on small synthetic run dicts with numbers worked out by hand: paired
differences against GRPO and against EBPO, the equal-samples view (each estimator's cross-fitted best G, its
ranking and paired differences, seeds that do not fully pair), the ranking figure, and the ``report`` command's
refusals. No training."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

T2, T3, T4 = 12.706205, 4.302653, 3.182446  # two-sided 95% t quantiles at 1, 2, 3 degrees of freedom


def _run(est: str, g: int, seed: int, final: float, probs: list[float] | None = None) -> dict:
    config = {"estimator": est, "group_size": g, "order": "random", "seed": seed, "lr": 3e-4, "split": "test"}
    metrics = {"accuracy": [0.3, final], **({"heldout_pass_final": probs} if probs else {})}
    return {"config": config, "metrics": metrics}


def _runs(table: dict[tuple[str, int], list[float | None]]) -> list[dict]:
    """Runs from {(estimator, G): final accuracy per seed 0, 1, ... (None: that seed's run is missing)}."""
    return [_run(e, g, s, v) for (e, g), vs in table.items() for s, v in enumerate(vs) if v is not None]


def _half(d: list[float], t: float) -> float:
    m = sum(d) / len(d)
    return t * math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1)) / math.sqrt(len(d))


def test_gains_over_grpo_and_paired_against_grpo_by_hand():
    """X - GRPO over the seeds both ran (X lacks seed 2): the two seeds' differences by hand; ``paired`` with
    reference grpo without ``gains`` is the same record with the sign and the wins swapped."""
    from ebpo_verl.study.report import gains_verdict, paired

    runs = _runs({("grpo", 2): [0.40, 0.42, 0.40], ("x", 2): [0.45, 0.40, None], ("ebpo", 2): [0.50, 0.52, 0.47]})
    gains = {p["estimator"]: p for p in paired(runs, ["grpo", "x", "ebpo"], [2], "grpo", gains=True)}
    assert set(gains) == {"x", "ebpo"} and gains["x"]["baseline"] == "grpo"
    assert gains["x"]["diff"] == pytest.approx([0.015, T2 * 0.035, 2], abs=1e-6)  # sd of (0.05, -0.02) = 0.07/sqrt2
    assert gains["x"]["wins"] == 1
    assert gains["ebpo"]["diff"] == pytest.approx([0.09, _half([0.10, 0.10, 0.07], T3), 3], abs=1e-6)
    assert gains["ebpo"]["wins"] == 3
    back = {p["baseline"]: p for p in paired(runs, ["grpo", "x", "ebpo"], [2], reference="grpo")}
    assert back["x"]["diff"] == pytest.approx([-0.015, T2 * 0.035, 2], abs=1e-6) and back["x"]["wins"] == 1
    assert back["ebpo"]["wins"] == 0
    # EBPO - X at the same time: the default reference
    ebpo = {p["baseline"]: p for p in paired(runs, ["grpo", "x", "ebpo"], [2])}
    assert ebpo["x"]["diff"] == pytest.approx([0.085, T2 * 0.035, 2], abs=1e-6)  # 0.05, 0.12
    # ebpo's interval (0.09 ± 0.037) lies above 0, x's covers it
    text = gains_verdict(list(gains.values()))
    assert text.startswith("G=2: ahead of grpo: ebpo +0.090 ± ") and text.endswith("; 1 not separated from it.")
    assert paired(runs, ["x", "ebpo"], [2], "grpo", gains=True) == []  # no GRPO in the preset: no gains


def test_gains_over_at_pass_64_by_hand():
    """X - GRPO in pass@64 from the per-prompt probabilities: 1 - (1 - p)^64 averaged over prompts, per seed."""
    from ebpo_verl.study.report import paired

    runs = [_run("grpo", 4, 0, 0.25, [0.5, 0.0]), _run("grpo", 4, 1, 0.5, [0.5, 0.5])]
    runs += [_run("x", 4, 0, 0.3, [0.1, 0.01]), _run("x", 4, 1, 0.3, [0.0, 0.5])]
    d = [
        ((1 - 0.9**64) + (1 - 0.99**64)) / 2 - (1 - 0.5**64) / 2,
        (1 - 0.5**64) / 2 - (1 - 0.5**64),
    ]
    (rec,) = paired(runs, ["grpo", "x"], [4], "grpo", k=64, gains=True)
    assert rec["diff"] == pytest.approx([sum(d) / 2, _half(d, T2), 2], abs=1e-6)
    assert rec["wins"] == 1 and d[0] > 0 > d[1]


def test_choose_g_by_hand():
    """The G with the highest mean over the given seeds (those it has); the smaller G on a tie; None without data."""
    from ebpo_verl.study.ranking import choose_g

    values = {(2, 0): 0.5, (2, 1): 0.3, (4, 0): 0.4, (4, 1): 0.4, (8, 1): 0.9}
    assert choose_g(values, [2, 4, 8], [0]) == 2
    assert choose_g(values, [2, 4, 8], [0, 1]) == 8  # G=8 has seed 1 only: its mean is 0.9
    assert choose_g(values, [2, 4], [0, 1]) == 2  # 0.4 = 0.4: the smaller G
    assert choose_g(values, [2, 4], [5]) is None


# Three estimators at G = 2, 4 over seeds 0-3 (b misses seed 3 at G=2). Worked out by hand:
#  a: even seeds {0, 2} choose G=2 (0.48 > 0.445), odd seeds {1, 3} choose G=4 (0.44 > 0.42); so seeds 1, 3 take
#     G=2 (0.40, 0.44) and seeds 0, 2 take G=4 (0.45, 0.44): mean 0.4325 over 4 seeds. In-sample: G=2, 0.45.
#  b: even seeds choose G=2 (0.42 > 0.405) -> seed 1 at G=2 is 0.42, seed 3 has no G=2 run: no value; odd seeds
#     choose G=4 (0.43 > 0.42, seed 1 only at G=2) -> seeds 0, 2 at G=4: 0.41, 0.40. Mean 0.41 over 3 seeds.
#  c: equal everywhere: G=2 on both folds (the tie), 0.5 on every seed.
RANKED = {
    ("a", 2): [0.50, 0.40, 0.46, 0.44],
    ("a", 4): [0.45, 0.48, 0.44, 0.40],
    ("b", 2): [0.42, 0.42, 0.42, None],
    ("b", 4): [0.41, 0.43, 0.40, 0.43],
    ("c", 2): [0.5, 0.5, 0.5, 0.5],
    ("c", 4): [0.5, 0.5, 0.5, 0.5],
}


def test_cross_fitted_best_g_by_hand():
    from ebpo_verl.study.ranking import cross_fitted
    from ebpo_verl.study.report import final_values

    final = final_values(_runs(RANKED))
    assert cross_fitted(final, "a", [2, 4]) == ({0: 0.45, 1: 0.40, 2: 0.44, 3: 0.44}, {0: 2, 1: 4})
    assert cross_fitted(final, "b", [2, 4]) == ({0: 0.41, 1: 0.42, 2: 0.40}, {0: 2, 1: 4})
    assert cross_fitted(final, "c", [2, 4]) == ({s: 0.5 for s in range(4)}, {0: 2, 1: 2})
    assert cross_fitted(final, "absent", [2, 4]) == ({}, {0: None, 1: None})


def test_equal_samples_ranking_and_pairs_by_hand():
    """Ranked c, a, b; leader - X and X - next paired over the seeds both have (b lacks seed 3)."""
    from ebpo_verl.study.ranking import equal_samples, ranking_table, ranking_verdict

    view = equal_samples(_runs(RANKED), ["a", "b", "c", "d"], [2, 4])  # d: no runs at all
    rows = view["ranking"]
    assert [r["estimator"] for r in rows] == ["c", "a", "b", "d"]
    c, a, b, d = rows
    assert c["best"] == pytest.approx([0.5, 0.0, 4])
    assert (c["g_chosen_on_even_seeds"], c["g_chosen_on_odd_seeds"]) == (2, 2)
    assert a["best"] == pytest.approx([0.4325, _half([0.45, 0.40, 0.44, 0.44], T4), 4], abs=1e-6)
    assert (a["g_chosen_on_even_seeds"], a["g_chosen_on_odd_seeds"]) == (2, 4)
    assert a["in_sample_g"] == 2 and a["in_sample"] == pytest.approx(
        [0.45, _half([0.5, 0.4, 0.46, 0.44], T4), 4], abs=1e-6
    )
    assert b["best"] == pytest.approx([0.41, _half([0.41, 0.42, 0.40], T3), 3], abs=1e-6)
    assert b["in_sample_g"] == 2 and b["in_sample"] == pytest.approx([0.42, 0.0, 3])  # G=4: 0.4175 over 4 seeds
    assert d["best"] == [None, None, 0] and d["in_sample_g"] is None
    # c - a on seeds 0-3: 0.05, 0.10, 0.06, 0.06; c - b on seeds 0-2: 0.09, 0.08, 0.10; a - b: 0.04, -0.02, 0.04
    assert a["vs_leader"]["diff"] == pytest.approx([0.0675, _half([0.05, 0.10, 0.06, 0.06], T4), 4], abs=1e-6)
    assert a["vs_leader"]["wins"] == 4
    assert b["vs_leader"]["diff"] == pytest.approx([0.09, _half([0.09, 0.08, 0.10], T3), 3], abs=1e-6)
    assert a["vs_next"]["diff"] == pytest.approx([0.02, _half([0.04, -0.02, 0.04], T3), 3], abs=1e-6)
    assert a["vs_next"]["wins"] == 2 and b["vs_next"]["diff"] == [None, None, 0] and d["vs_next"] is None
    lines = ranking_table(view).splitlines()
    assert len(lines) == 2 + 4 and lines[2].startswith("| 1 | c | 2 / 2 | 0.500 ± 0.000 (4) | — |")
    view["ranking"] = [c, b]  # b's interval of c - b (0.09 ± 0.025) lies above 0; a row that covers 0:
    c["best"], b["vs_leader"]["diff"] = [0.5, 0.01, 4], [0.01, 0.02, 3]
    assert ranking_verdict(view) == (
        "Leader in pass@1: c, 0.500 ± 0.010 over 4 seeds. It covers 0 against b; no single winner."
    )
    view = equal_samples(_runs(RANKED), ["a", "b", "c", "d"], [2, 4])
    assert "| 3 | b | 2 / 4 | 0.410 ± 0.025 (3) | +0.090 ± 0.025 (3/3) | — |" in lines[4]
    assert ranking_verdict(view) == (
        "Leader in pass@1: c, 0.500 ± 0.000 over 4 seeds. Its paired 95% interval is above 0 against a, b; "
        "fewer than 2 seeds pair with d."
    )


def test_ranking_figure_is_a_png(tmp_path):
    from ebpo_verl.study.ranking import equal_samples, ranking_figure

    runs = _runs(RANKED)
    views = [equal_samples(runs, ["a", "b", "c"], [2, 4], k) for k in (1,)]
    ranking_figure(views, runs, [2, 4], tmp_path / "ranking.png", "a source line")
    assert (tmp_path / "ranking.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["ranking.png"]  # no temporary file left


@pytest.mark.parametrize(
    "config, says",
    [
        (None, "study_config.json not found: --study must be a study's --out folder"),
        ({"name": "nope"}, "names preset 'nope', which this code does not have"),
        ({"seeds": 3}, "with a configuration this code's preset does not have (differs in: seeds)"),
        ({}, "has no saved warm start (base_model.pt)"),
    ],
)
def test_report_command_refuses_in_one_line(tmp_path, capsys, config, says):
    """``report`` on a folder that is not a study, names an unknown preset, differs from the preset, or has no warm
    start: exit 2, one error line, nothing written into the study folder."""
    from ebpo_verl.study.__main__ import main
    from ebpo_verl.study.presets import PRESETS

    study = tmp_path / "study"
    study.mkdir()
    if config is not None:
        (study / "study_config.json").write_text(json.dumps({**PRESETS["tiny"].fingerprint(), **config}))
    before = sorted(study.iterdir())
    assert main(["report", "--study", str(study), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("python -m ebpo_verl.study: error: ") and says in err, err
    assert sorted(study.iterdir()) == before


RIVALS = Path(__file__).resolve().parents[1] / "docs" / "study_rivals"


def check_rivals_summary(summary: dict) -> None:
    """Relations a complete rivals report's summary.json satisfies, computed independently of the code that wrote
    it: the grid complete, the ranking sorted, each in-sample best the best cell of its row, each cross-fitted
    best its cell where both folds chose one G, every paired mean the difference of the means (all seeds pair)."""
    from ebpo_verl.study.presets import PRESETS

    preset = PRESETS["rivals"]
    gs, seeds = list(preset.group_sizes), preset.seeds
    assert summary["preset"] == "rivals" and summary["n_runs"] == len(preset.cells()) * seeds
    tuning = (
        len(preset.estimators) * len(preset.tune["group_sizes"]) * len(preset.lr_grid["grpo"]) * preset.tune["seeds"]
    )
    assert summary["tuning_runs"] == tuning and summary["wall_seconds"] > 0
    cells = {(c["estimator"], c["group_size"]): c for c in summary["cells"]}
    for k, key in ((1, "final_accuracy"), (64, "pass_at_64")):
        rows = summary["equal_samples"][str(k)]["ranking"]
        assert sorted(r["estimator"] for r in rows) == sorted(preset.estimators)
        assert [r["best"][0] for r in rows] == sorted((r["best"][0] for r in rows), reverse=True)
        for r in rows:
            row = [cells[r["estimator"], g][key][0] for g in gs]
            assert r["best"][2] == seeds and {r["g_chosen_on_even_seeds"], r["g_chosen_on_odd_seeds"]} <= set(gs)
            assert r["in_sample"] == cells[r["estimator"], r["in_sample_g"]][key] and r["in_sample"][0] == max(row)
            if r["g_chosen_on_even_seeds"] == r["g_chosen_on_odd_seeds"]:  # one G for every seed: that cell
                assert r["best"] == pytest.approx(cells[r["estimator"], r["g_chosen_on_even_seeds"]][key], abs=2e-6)
            assert r["vs_leader"]["diff"][0] == pytest.approx(rows[0]["best"][0] - r["best"][0], abs=3e-6)
            assert r["vs_leader"]["diff"][2] == seeds
        for p in summary["gain_over_grpo_pass_at_k"][str(k)]:
            g, x = p["group_size"], p["estimator"]
            assert p["diff"][2] == seeds
            assert p["diff"][0] == pytest.approx(cells[x, g][key][0] - cells["grpo", g][key][0], abs=3e-6)


def test_the_committed_rivals_report_is_consistent():
    """docs/study_rivals/summary.json, once committed (the lead writes it with ``python -m ebpo_verl.study report
    --study DIR --out docs/study_rivals``), satisfies :func:`check_rivals_summary`."""
    path = RIVALS / "summary.json"
    if not path.is_file():
        pytest.skip(f"{path} is not committed yet: the rivals study's report has not landed")
    check_rivals_summary(json.loads(path.read_text()))


def test_report_refuses_a_code_that_is_not_an_object_and_reruns_a_run_whose_metrics_are_not(tmp_path, capsys):
    """Before: ``code: "x"`` in study_config.json and ``metrics: "x"`` in a saved run ended in AttributeError /
    TypeError tracebacks (read by code, not run)."""
    from ebpo_verl.study import runner
    from ebpo_verl.study.__main__ import main
    from ebpo_verl.study.presets import PRESETS

    study = tmp_path / "study"
    study.mkdir()
    (study / "study_config.json").write_text(json.dumps({**PRESETS["tiny"].fingerprint(), "code": "x" * 100_000}))
    assert main(["report", "--study", str(study), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "records code 'xxxxxxxx" in err and len(err) < 400, err
    job = runner.grid(PRESETS["tiny"], dict.fromkeys(PRESETS["tiny"].estimators, 1e-4))[0]
    path = runner.run_path(study, job)
    path.parent.mkdir()
    path.write_text(json.dumps({"config": dataclasses.asdict(job), "metrics": "x"}))
    assert runner.load_done(study, [job]) == {}
    assert "is unreadable (metrics is 'x', not an object): running it again" in capsys.readouterr().out
