"""ebpo_verl.recipes.make_tables and plot_dynamics on synthetic metrics logs in verl's file-logger format.

The expected tables are computed by hand from the numbers written into the logs (see each test's comments).
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest

from ebpo_verl.ops.provenance import provenance
from ebpo_verl.options.cli import parse
from ebpo_verl.recipes import make_tables, plot_dynamics
from ebpo_verl.recipes import paper as paper_numbers

BENCH = ["math500", "aime2024", "aime2025", "amc23", "olympiadbench"]


def val(*accs: float | None, k: int = 16) -> dict:
    return {f"val-core/{b}/acc/mean@{k}": a for b, a in zip(BENCH, accs, strict=True) if a is not None}


def write_log(path: Path, records: list[tuple[int, dict]], tail: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in records)
    path.write_text(text + tail)
    return path


# plain run: validations at steps 0 (avg 30), 4 (avg 50) and 8 (avg 40, the final one)
PLAIN = [
    (0, val(0.5, 0.2, 0.1, 0.4, 0.3)),
    (1, {"actor/grad_norm": 0.3}),
    (2, {"actor/grad_norm": 0.2}),
    (4, {"actor/grad_norm": 0.1, **val(0.7, 0.4, 0.3, 0.6, 0.5)}),
    (8, {"actor/grad_norm": 0.1, **val(0.6, 0.3, 0.2, 0.5, 0.4)}),
]
# attempt 1 ran to step 6 (validation at 5: 90 everywhere) and crashed after its step-4 checkpoint;
# attempt 2 resumed from step 4 (validation before training: 40), validated at 8 (55). Step 5's 90 is stale.
ATTEMPT1 = [(0, val(0.1, 0.1, 0.1, 0.1, 0.1))] + [
    (s, {"actor/grad_norm": float(s), **(val(0.9, 0.9, 0.9, 0.9, 0.9) if s == 5 else {})}) for s in range(1, 7)
]
ATTEMPT2 = [(4, val(0.4, 0.4, 0.4, 0.4, 0.4))] + [
    (s, {"actor/grad_norm": 10.0 + s, **(val(0.55, 0.55, 0.55, 0.55, 0.55) if s == 8 else {})}) for s in range(5, 9)
]


@pytest.fixture
def runs(tmp_path):
    plain = write_log(tmp_path / "plain" / "metrics.jsonl", PLAIN).parent
    resumed = write_log(tmp_path / "resumed.jsonl", ATTEMPT1 + ATTEMPT2)
    # the same two attempts as separate files: natural order puts run.2 before run.10
    split = tmp_path / "split"
    write_log(split / "run.2.jsonl", ATTEMPT1)
    write_log(split / "run.10.jsonl", ATTEMPT2)
    return {"plain": plain, "resumed": resumed, "split": split, "missing": tmp_path / "never-ran"}


def read_csv(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    with open(path, newline="") as f:
        return {(r["section"], r["method"]): r for r in csv.DictReader(f)}


def test_resumed_run_supersedes_redone_steps_and_merges_the_resume_step(runs):
    for path in (runs["resumed"], runs["split"]):
        run = make_tables.read_run(path)
        assert sorted(run) == [0, 1, 2, 3, 4, 5, 6, 7, 8]
        assert run[5] == {"actor/grad_norm": 15.0}  # attempt 1's step 5 (with its validation) is gone
        assert run[6] == {"actor/grad_norm": 16.0}
        assert run[4] == {"actor/grad_norm": 4.0, **val(0.4, 0.4, 0.4, 0.4, 0.4)}  # merged at the resume step
        step, scores, ks = make_tables.select_validation(run, "best")
        assert (step, ks) == (8, {16}) and scores == pytest.approx(dict.fromkeys(BENCH, 55.0))


def test_directory_reading_rules(tmp_path):
    run = tmp_path / "run"
    write_log(run / "metrics.jsonl", PLAIN)
    write_log(run / "metrics.superseded-20260101T000000Z-1.jsonl", [(9, val(1, 1, 1, 1, 1))])
    write_log(run / "other.jsonl", [(9, val(1, 1, 1, 1, 1))])
    assert max(make_tables.read_run(run)) == 8  # metrics.jsonl wins; superseded lines are never read
    (run / "metrics.jsonl").unlink()
    assert [p.name for p in make_tables.log_files(run)] == ["other.jsonl"]
    assert make_tables.read_run(tmp_path / "nothing") == {}


def test_torn_last_line_is_skipped_and_a_broken_line_is_an_error(tmp_path):
    torn = write_log(tmp_path / "torn.jsonl", PLAIN, tail='{"step": 9, "data": {"val-co')
    with pytest.warns(UserWarning, match="torn last line"):
        assert max(make_tables.read_run(torn)) == 8
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 0, "data": {}}\n{"step": "x", "data": {}}\n{"step": 2, "data": {}}\n')
    with pytest.raises(make_tables.MetricsLogError, match=r"bad\.jsonl:2"):
        make_tables.read_run(bad)
    assert make_tables.main([str(bad), "--out", str(tmp_path / "o")]) == 1
    assert not (tmp_path / "o").exists()


def test_non_finite_and_null_values_count_as_missing(tmp_path):
    log = tmp_path / "nan.jsonl"
    log.write_text(
        '{"step": 3, "data": {"val-core/math500/acc/mean@16": NaN, "val-core/aime2024/acc/mean@16": null, '
        '"val-core/aime2025/acc/mean@16": 0.25, "val-core/amc23/acc/mean@4": 0.5, "val-core/amc23/acc/mean@16": 0.75,'
        ' "val-core/olympiadbench/acc/mean@16": 0.125, "val-core/other/acc/mean@16": 0.9}}\n'
    )
    step, scores, ks = make_tables.select_validation(make_tables.read_run(log), "final")
    assert step == 3 and ks == {16}
    assert scores == {"aime2025": 25.0, "amc23": 75.0, "olympiadbench": 12.5}  # largest k per benchmark
    assert make_tables.average(scores) is None
    assert make_tables.select_validation(make_tables.read_run(log), "best") is None


def write_results(path: Path, protocol: str, *scores: float, complete: bool = True, step: int | None = None) -> str:
    """A RESULTS.json of ``python -m ebpo_verl.evaluate grade`` with the given pass@1 (%) per benchmark."""
    benches = {
        b: {"pass@1": x, "runs": 16, "problems": 30, "samples": 480, "complete": complete}
        for b, x in zip(BENCH, scores, strict=True)
    }
    record = {"protocol": protocol, "model": "m", "step": step, "benchmarks": benches, "average": None}
    record["provenance"] = provenance(seed=0)  # as the grade command writes it
    path.write_text(json.dumps(record))
    return str(path)


def test_grpo_bn_table_by_hand(runs, tmp_path):
    out = tmp_path / "results"
    paper = write_results(tmp_path / "grpo.json", "paper", 60, 30, 20, 50, 40)
    specs = [
        f"Qwen3-8B/GRPO={paper}",
        f"Qwen3-8B/GRPO+BN={runs['plain']}",
        f"Qwen3-8B/EBPO={runs['resumed']}",
        f"Qwen3-14B/EBPO={runs['missing']}",
    ]
    assert make_tables.main([*specs, "--table", "grpo_bn", "--out", str(out)]) == 0
    rows = read_csv(out / "grpo_bn.csv")
    assert list(rows) == [
        ("Qwen3-8B", "GRPO"),
        ("Qwen3-8B", "GRPO+BN"),
        ("Qwen3-8B", "EBPO"),
        ("Qwen3-14B", "GRPO"),
        ("Qwen3-14B", "GRPO+BN"),
        ("Qwen3-14B", "EBPO"),
    ]
    grpo = rows["Qwen3-8B", "GRPO"]  # paper protocol: 60 30 20 50 40 -> 40.00; paper 58.72
    assert [grpo[b] for b in BENCH] == ["60.00", "30.00", "20.00", "50.00", "40.00"]
    assert (grpo["avg"], grpo["paper_avg"], grpo["diff_avg"], grpo["step"], grpo["k"], grpo["protocol"]) == (
        "40.00",
        "58.72",
        "-18.72",
        "",
        "16",
        "paper",
    )
    bn = rows["Qwen3-8B", "GRPO+BN"]  # training validation (final, step 8): no paper numbers beside it
    assert (bn["avg"], bn["paper_avg"], bn["diff_avg"], bn["step"], bn["protocol"]) == (
        "40.00",
        "",
        "",
        "8",
        "validation",
    )
    ebpo = rows["Qwen3-8B", "EBPO"]  # 55 everywhere at step 8
    assert (ebpo["avg"], ebpo["paper_avg"], ebpo["paper_math500"], ebpo["step"]) == ("55.00", "", "", "8")
    for key, why in [(("Qwen3-8B", "GRPO+BN"), ""), (("Qwen3-14B", "GRPO"), "not run")]:
        assert rows[key]["missing"] == why
    assert rows["Qwen3-14B", "EBPO"]["missing"] == "no metrics log" and rows["Qwen3-14B", "EBPO"]["avg"] == ""
    assert rows["Qwen3-14B", "GRPO+BN"]["paper_avg"] == "59.98"  # not run: the paper's number for reference
    md = (out / "grpo_bn.md").read_text()
    assert md.startswith("# grpo_bn: Pass@1 (%), protocol: paper, validation (final)\n")
    assert "- paper: the authors' evaluation" in md and "only beside paper-protocol results" in md
    assert "| Qwen3-8B | GRPO | 60.00 | 30.00 | 20.00 | 50.00 | 40.00 | 40.00 | 58.72 | -18.72 |  | paper |" in md
    assert "| Qwen3-8B | GRPO+BN | 60.00 | 30.00 | 20.00 | 50.00 | 40.00 | 40.00 |  |  | 8 | validation |" in md
    assert "| Qwen3-14B | EBPO |  |  |  |  |  |  | 61.75 |  |  |  |" in md
    assert f"Qwen3-14B/EBPO (no metrics log: {runs['missing']})" in md

    make_tables.main([*specs, "--table", "grpo_bn", "--out", str(out), "--select", "best"])
    bn = read_csv(out / "grpo_bn.csv")["Qwen3-8B", "GRPO+BN"]  # best: step 4, avg 50
    assert (bn["avg"], bn["diff_avg"], bn["step"]) == ("50.00", "", "4")
    assert read_csv(out / "grpo_bn.csv")["Qwen3-8B", "GRPO"]["avg"] == "40.00"  # RESULTS.json: no selection


def test_curriculum_contrast_and_paper_rows(runs, tmp_path):
    out = tmp_path / "results"
    ebpo = write_results(tmp_path / "ebpo.json", "paper", 60, 30, 20, 50, 40, step=33)
    grpo = write_results(tmp_path / "grpo.json", "paper", 55, 55, 55, 55, 55, step=33)
    make_tables.make_tables([f"Qwen3-8B-Base/EBPO-diff={ebpo}", f"Qwen3-8B-Base/GRPO-diff={grpo}"], out, "curriculum")
    rows = read_csv(out / "curriculum.csv")
    diff = rows["Qwen3-8B-Base", "EBPO-diff − GRPO-diff"]  # (60 30 20 50 40) - 55
    assert [diff[b] for b in BENCH] == ["5.00", "-25.00", "-35.00", "-5.00", "-15.00"]
    assert (diff["paper_aime2024"], diff["paper_aime2025"], diff["paper_math500"]) == ("3.95", "6.04", "")
    assert rows["Qwen3-8B-Base", "EBPO-diff"]["step"] == "33"  # the evaluated checkpoint, from RESULTS.json
    # the reference rows: authors' step-34 logs (docs/paper_notes.md#logged-numbers), EBPO-diff 28.12, ours 40 -> +11.88
    assert (rows["Qwen3-8B-Base", "EBPO-diff"]["paper_avg"], rows["Qwen3-8B-Base", "EBPO-diff"]["diff_avg"]) == (
        "28.12",
        "11.88",
    )
    md = (out / "curriculum.md").read_text()
    assert "| Qwen3-8B-Base | EBPO-diff − GRPO-diff | +5.00 | -25.00 | -35.00 | -5.00 | -15.00 |" in md
    assert "|  | EBPO-diff − GRPO-diff (paper figure) |  | +3.95 | +6.04 |  |  |" in md
    # the authors' logs: 54.41-54.90, 10.42-9.38, 9.58-9.17, 40.63-36.41, 25.56-25.22
    assert "|  | EBPO-diff − GRPO-diff (authors' logs, step 34) | -0.49 | +1.04 | +0.41 | +4.22 | +0.34 |" in md
    assert "|  | EBPO-diff (authors' logs, step 34) | 54.41 | 10.42 | 9.58 | 40.63 | 25.56 |" in md
    assert "| 40.00 | 28.12 | +11.88 | 33 | paper |" in md
    assert md.count("| Qwen3-8B-Base |") == 5 and md.count("| Qwen3-14B-Base |") == 3  # 4 + 2 rows, 2 contrasts

    # one side from a training validation: the difference mixes protocols and stays empty
    make_tables.make_tables(
        [f"Qwen3-8B-Base/EBPO-diff={ebpo}", f"Qwen3-8B-Base/GRPO-diff={runs['split']}"], out, "curriculum"
    )
    diff = read_csv(out / "curriculum.csv")["Qwen3-8B-Base", "EBPO-diff − GRPO-diff"]
    assert diff["math500"] == "" and diff["protocol"] == "mixed" and diff["paper_aime2024"] == ""

    make_tables.make_tables([f"Qwen3-8B/EBPO={runs['plain']}"], out, "main")
    md = (out / "main.md").read_text()
    assert "EBPO (paper)" not in md  # beside a training validation: no paper numbers
    assert md.count("| Qwen3-8B |") == 9 and md.count("| LLaMA3.1-8B |") == 5
    make_tables.make_tables([], out, "main")  # not run: the paper's numbers for reference
    assert "|  | EBPO (paper) | 76.80 | 56.04 | 47.92 | 86.25 | 54.93 |" in (out / "main.md").read_text()

    verl = write_results(tmp_path / "verl.json", "verl", 70, 50, 40, 80, 50, complete=False)
    make_tables.make_tables([f"Qwen3-8B/EBPO={verl}"], out, "main")
    row = read_csv(out / "main.csv")["Qwen3-8B", "EBPO"]
    assert (row["avg"], row["paper_avg"], row["protocol"]) == ("58.00", "", "verl")
    assert row["missing"] == "incomplete: graded with --allow-partial"
    assert "protocol: verl" in (out / "main.md").read_text()


def test_limit_and_partial_results_are_marked(tmp_path):
    """A --limit 4 AIME 2024 evaluation (4 of 30 problems) and an --allow-partial benchmark (470 of 480 samples)
    never look like full-benchmark numbers: the cell says what it covered, Avg and Numbers say partial, a note
    under the table explains, and the CSV has the coverage."""
    path = tmp_path / "limit.json"
    write_results(path, "paper", 60, 25, 20, 50, 40)
    data = json.loads(path.read_text())
    for v in data["benchmarks"].values():
        v |= {"limit": None, "problems_in_data": 30}
    data["benchmarks"]["aime2024"] |= {"problems": 4, "samples": 64, "limit": 4}
    data["benchmarks"]["amc23"] |= {"samples": 470, "complete": False}
    path.write_text(json.dumps(data))
    out = tmp_path / "t"
    make_tables.make_tables([f"Qwen3-8B/EBPO={path}"], out)
    md = (out / "runs.md").read_text()
    # avg (60 + 25 + 20 + 50 + 40) / 5 = 39.00
    assert "| 60.00 | 25.00 (4/30 problems) | 20.00 | 50.00 (470/480 samples) | 40.00 | 39.00 (partial) |" in md
    assert "| paper | ours, partial |" in md
    assert (
        "**Partial results, not comparable with full-benchmark numbers**: Qwen3-8B/EBPO (AIME24 4/30 problems; "
        "AMC23 470/480 samples)" in md
    )
    row = read_csv(out / "runs.csv")["Qwen3-8B", "EBPO"]
    assert (row["aime2024"], row["numbers"], row["coverage"]) == (
        "25.00",
        "ours, partial",
        "AIME24 4/30 problems; AMC23 470/480 samples",
    )
    full = write_results(tmp_path / "full.json", "paper", 60, 25, 20, 50, 40)  # no limit keys (older file)
    make_tables.make_tables([f"Qwen3-8B/EBPO={full}"], out)
    assert "partial" not in (out / "runs.md").read_text()


def test_results_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"protocol": "mine", "benchmarks": {}}')
    assert make_tables.main([f"A/x={bad}", "--out", str(tmp_path / "o")]) == 1
    with pytest.raises(ValueError, match="absent.json: no such file or folder"):  # a run outside a table's layout
        make_tables.build_rows(None, [f"A/x={tmp_path / 'absent.json'}"], "final")
    rows = make_tables.build_rows("main", [f"Qwen3-8B/EBPO={tmp_path / 'absent.json'}"], "final")
    row = next(r for r in rows if (r.section, r.method) == ("Qwen3-8B", "EBPO"))
    assert row.missing == "no results file" and row.scores == {}  # a table's row not evaluated yet: an empty cell


def test_unlabelled_runs_and_label_errors(runs, tmp_path):
    out = tmp_path / "adhoc"
    make_tables.make_tables([str(runs["plain"]), str(runs["resumed"])], out)
    rows = read_csv(out / "runs.csv")
    assert list(rows) == [("runs", "plain"), ("runs", "resumed")]
    assert rows["runs", "resumed"]["paper_avg"] == "" and rows["runs", "plain"]["avg"] == "40.00"
    with pytest.raises(ValueError, match="two runs for the row"):
        make_tables.make_tables([f"A/x={runs['plain']}", f"A/x={runs['resumed']}"], out)
    with pytest.raises(ValueError, match="bad run label"):
        make_tables.make_tables([f"A/={runs['plain']}"], out)


def test_paper_numbers_match_the_paper_notes():
    """Transcription check against docs/paper_notes.md (parsed here independently)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "paper_notes.md").read_text()
    methods = ["GRPO", "Dr.GRPO", "DAPO", "EntropyMech", "EBPO"]
    for model in ["Qwen3-8B", "Qwen3-14B", "LLaMA3.1-8B"]:
        cells = re.search(rf"^\| {re.escape(model)} \|(.*)\|$", text, re.M).group(1).split("|")
        assert [paper_numbers.PAPER["main"][model][m]["avg"] for m in methods] == [float(c) for c in cells]
    for g in (8, 16, 32):
        nums = re.search(rf"G={g}: (\d+\.\d+) / (\d+\.\d+) / (\d+\.\d+)", text).groups()
        paper = paper_numbers.PAPER["group_size"][f"G={g}"]
        assert [paper[m]["avg"] for m in ("EBPO", "GRPO", "DAPO")] == [float(x) for x in nums]
    ebpo = paper_numbers.PAPER["main"]["Qwen3-8B"]["EBPO"]
    assert math.isclose(sum(ebpo[b] for b in BENCH) / 5, ebpo["avg"], abs_tol=0.005)
    assert list(paper_numbers.BENCHMARKS) == BENCH
    # the curriculum reference rows: the notes' table of the authors' step-34 logs
    for model, runs in paper_numbers.PAPER["curriculum"].items():
        for method, row in runs.items():
            cells = re.search(rf"^\| {re.escape(model)} {re.escape(method)}, step 34 \|(.*)\|$", text, re.M)
            assert [row[b] for b in [*BENCH, "avg"]] == [float(c) for c in cells.group(1).split("|")]


def test_plot_dynamics_writes_png_per_metric(runs, tmp_path):
    ebpo = tmp_path / "ebpo.jsonl"
    records = [
        (
            s,
            {
                "actor/grad_norm": 1.0 / s,
                "actor/ppo_kl": 0.01,
                "actor/entropy": 0.5,
                "critic/score/mean": s / 10,
                "response_length/mean": 900.0 + s,
                "ebpo/shrinkage_mean": 0.3,
                "ebpo/mu_glob": 0.4,
                "ebpo/cluster/3/mu_glob": 0.1,
            },
        )
        for s in range(1, 11)
    ]
    write_log(ebpo, records)
    out = tmp_path / "plots"
    paths = plot_dynamics.plot_dynamics(
        [f"EBPO={ebpo}", f"GRPO={runs['resumed']}", f"gone={runs['missing']}"], out, window=2
    )
    names = sorted(p.name for p in paths)
    assert names == sorted(
        [
            "actor_grad_norm.png",
            "actor_ppo_kl.png",
            "actor_entropy.png",
            "critic_score_mean.png",
            "response_length_mean.png",
            "ebpo_mu_glob.png",
            "ebpo_shrinkage_mean.png",
            "dynamics.png",
        ]
    )
    import matplotlib.image as mpimg

    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
        height, width = mpimg.imread(path).shape[:2]
        assert height > 100 and width > 100
    # the resumed run's line uses the second attempt at steps 5..8
    assert plot_dynamics.series(make_tables.read_run(runs["resumed"]), "actor/grad_norm") == (
        [1, 2, 3, 4, 5, 6, 7, 8],
        [1.0, 2.0, 3.0, 4.0, 15.0, 16.0, 17.0, 18.0],
    )
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_dynamics.plot_dynamics([str(runs["missing"])], tmp_path / "none")


def test_smoothing_by_hand():
    assert plot_dynamics.smooth([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert plot_dynamics.smooth([3.0, 0.0, 6.0], 5) == [3.0, 1.5, 3.0]
    assert plot_dynamics.smooth([2.0, 4.0], 1) == [2.0, 4.0]
    run = {1: {"k": 1.0}, 2: {"k": None}, 3: {"k": float("nan")}, 4: {"k": True}, 5: {"k": 2}}
    assert plot_dynamics.series(run, "k") == ([1, 5], [1.0, 2.0])


def test_the_command_line_is_parsed_into_its_declaration_once(tmp_path, capsys):
    """RUN arguments are a declared field of MakeTablesOptions; neither runs nor --table is one line, exit 2."""
    with pytest.raises(SystemExit) as exit_:
        make_tables.main(["--out", str(tmp_path / "o")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "python -m ebpo_verl.recipes.make_tables: error: give runs, or --table to print the paper's table with "
        "empty cells"
    )
    options = parse(make_tables.MakeTablesOptions, "make_tables", ["A/x=run1", "run2", "--out", "o"])
    assert (options.runs, options.out, options.metric) == (("A/x=run1", "run2"), "o", (make_tables.DEFAULT_METRIC,))
