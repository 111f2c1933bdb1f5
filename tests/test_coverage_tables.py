"""make_tables --metric (pass@K, maj@K, avg@n tables from RESULTS.json coverage keys) and the pass@k plot command,
on RESULTS.json files written by hand: a paper-protocol run (OlympiadBench n = 4, the rest n = 16) and a verl one."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ebpo_verl.recipes import make_tables, plot_pass_at_k  # noqa: E402

BENCH = ["math500", "aime2024", "aime2025", "amc23", "olympiadbench"]


def coverage(n: int, base: float) -> dict:
    """Coverage keys of a benchmark with n samples per problem: pass@k = base + k, maj@k = base + k / 2."""
    ks = [k for k in (1, 2, 4, 8, 16) if k <= n]
    return {
        "n": n,
        "pass@k": {str(k): base + k for k in ks},
        "pass@k_stderr": {str(k): 1.0 for k in ks},
        "maj@k": {str(k): base + k / 2 for k in ks},
        "maj@k_stderr": {str(k): 1.0 for k in ks},
        "avg@n": base + 1,
        "avg@n_stderr": 0.5,
    }


def write_results(path: Path, protocol: str, bases: list[float], olympiad_n: int) -> str:
    benches = {}
    for bench, base in zip(BENCH, bases, strict=True):
        n = olympiad_n if bench == "olympiadbench" else 16
        benches[bench] = {"pass@1": base + 1, "runs": n, "problems": 30, "samples": 30 * n, "complete": True}
        benches[bench] |= coverage(n, base)
    ks = ["1", "2", "4"] + (["8", "16"] if olympiad_n == 16 else [])
    record = {"protocol": protocol, "model": "m", "step": 200, "benchmarks": benches, "average": None}
    for name in ("pass@k", "maj@k"):
        record[f"average_{name}"] = {k: sum(b[name][k] for b in benches.values()) / 5 for k in ks}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return str(path)


def read_csv(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    with open(path, newline="") as f:
        return {(r["section"], r["method"]): r for r in csv.DictReader(f)}


def test_metric_tables_by_hand(tmp_path, capsys):
    paper = write_results(tmp_path / "ebpo" / "results-paper.json", "paper", [60, 20, 10, 50, 30], olympiad_n=4)
    verl = write_results(tmp_path / "grpo" / "results-verl.json", "verl", [50, 10, 0, 40, 20], olympiad_n=16)
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"step": 1, "data": {f"val-core/{b}/acc/mean@4": 0.5 for b in BENCH}}) + "\n")
    out = tmp_path / "t"
    argv = [f"Qwen3-8B/EBPO={paper}", f"Qwen3-8B/GRPO={verl}", f"Qwen3-8B/val={log}", "--out", str(out)]
    assert make_tables.main([*argv, "--metric", "pass@1", "pass@16", "maj@4", "avg@n"]) == 0
    rows = read_csv(out / "runs-pass@16.csv")
    ebpo, grpo, val = rows["Qwen3-8B", "EBPO"], rows["Qwen3-8B", "GRPO"], rows["Qwen3-8B", "val"]
    # pass@16 = base + 16; OlympiadBench has n = 4 under the paper protocol: no pass@16, so no Avg
    assert [ebpo[b] for b in BENCH] == ["76.00", "36.00", "26.00", "66.00", ""] and ebpo["avg"] == ""
    assert [grpo[b] for b in BENCH] == ["66.00", "26.00", "16.00", "56.00", "36.00"]
    assert grpo["avg"] == f"{(66 + 26 + 16 + 56 + 36) / 5:.2f}"
    assert val["missing"] == "a metrics log holds pass@1 only, not pass@16" and val["math500"] == ""
    md = (out / "runs-pass@16.md").read_text()
    assert md.startswith("# runs: pass@16 (%), protocol: paper, verl\n")
    assert f"Empty rows: Qwen3-8B/val (a metrics log holds pass@1 only, not pass@16: {log})." in md
    assert "**No pass@16 in the results** of Qwen3-8B/EBPO (Olympiad)" in md
    maj = read_csv(out / "runs-maj@4.csv")["Qwen3-8B", "EBPO"]
    assert [maj[b] for b in BENCH] == ["62.00", "22.00", "12.00", "52.00", "32.00"]  # base + 4 / 2, n = 4 has it
    assert maj["avg"] == f"{(62 + 22 + 12 + 52 + 32) / 5:.2f}"
    assert read_csv(out / "runs-avg@n.csv")["Qwen3-8B", "GRPO"]["aime2024"] == "11.00"
    # a RESULTS.json graded before coverage was reported: an empty row that says why
    old = json.loads(Path(paper).read_text())
    for entry in old["benchmarks"].values():
        entry.pop("pass@k")
    Path(paper).write_text(json.dumps(old))
    make_tables.make_tables([f"Qwen3-8B/EBPO={paper}"], out, metric="pass@2")
    row = read_csv(out / "runs-pass@2.csv")["Qwen3-8B", "EBPO"]
    assert (row["missing"], row["numbers"], row["math500"]) == ("no pass@2 in the results", "not run", "")
    restored = write_results(Path(paper), "paper", [60, 20, 10, 50, 30], olympiad_n=4)
    # pass@1: the table as before (the file name and title without a metric suffix, pass@1 from "pass@1")
    assert make_tables.main([f"Qwen3-8B/EBPO={restored}", "--out", str(out)]) == 0
    plain = read_csv(out / "runs.csv")["Qwen3-8B", "EBPO"]
    assert [plain[b] for b in BENCH] == ["61.00", "21.00", "11.00", "51.00", "31.00"]
    assert (out / "runs.md").read_text().startswith("# runs: Pass@1 (%), protocol:")
    assert make_tables.main([*argv, "--metric", "best@4"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["make_tables: error: unknown metric 'best@4': expected pass@K, maj@K (K = 1, 2, 4, ..., n) or avg@n"]


def test_paper_numbers_only_in_the_pass_at_1_table(tmp_path):
    paper = write_results(tmp_path / "r.json", "paper", [60, 20, 10, 50, 30], olympiad_n=4)
    out = tmp_path / "t"
    make_tables.make_tables([f"Qwen3-8B/EBPO={paper}"], out, "main")
    assert "| EBPO (paper) |" in (out / "main.md").read_text()
    make_tables.make_tables([f"Qwen3-8B/EBPO={paper}"], out, "main", metric="maj@2")
    md = (out / "main-maj@2.md").read_text()
    assert "| EBPO (paper) |" not in md and "PAPER, not ours" not in md.split("Numbers:")[0]
    assert "- the paper reports pass@1 only: no paper numbers beside maj@2" in md
    row = read_csv(out / "main-maj@2.csv")["Qwen3-8B", "EBPO"]
    assert (row["aime2024"], row["paper_aime2024"], row["paper_avg"]) == ("21.00", "", "")


def test_plot_pass_at_k_from_two_results_files(tmp_path, capsys):
    paper = write_results(tmp_path / "ebpo" / "results-paper.json", "paper", [60, 20, 10, 50, 30], olympiad_n=4)
    verl = write_results(tmp_path / "grpo" / "results-verl.json", "verl", [50, 10, 0, 40, 20], olympiad_n=16)
    png = tmp_path / "fig" / "pass_at_k.png"
    assert plot_pass_at_k.main([paper, f"GRPO={verl}", "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    runs = plot_pass_at_k.load_runs([paper, f"GRPO={verl}"], "pass@k")
    assert list(runs) == ["ebpo (paper)", "GRPO (verl)"]
    assert runs["ebpo (paper)"]["olympiadbench"][:2] == ([1, 2, 4], [31, 32, 34])
    assert runs["ebpo (paper)"]["average"][0] == [1, 2, 4]  # only the k every benchmark has
    assert runs["GRPO (verl)"]["aime2024"][:2] == ([1, 2, 4, 8, 16], [11, 12, 14, 18, 26])
    fig = plot_pass_at_k.draw(runs, "pass@k")
    try:
        axes = [ax for ax in fig.axes if ax.get_visible()]
        assert [ax.get_title() for ax in axes] == [
            "MATH-500", "AIME24", "AIME25", "AMC23", "Olympiad", "average (k every benchmark has)"
        ]  # fmt: skip
        for ax in axes:
            assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ebpo (paper)", "GRPO (verl)"]
        olympiad = axes[4].get_lines()
        drawn = {tuple(line.get_xdata()) for line in olympiad if len(line.get_xdata()) > 1}
        assert drawn == {(1, 2, 4), (1, 2, 4, 8, 16)}
    finally:
        plt.close(fig)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"protocol": "paper", "benchmarks": {"aime2024": {"pass@1": 40.0}}}))
    assert plot_pass_at_k.main([str(old), "--out", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"plot_pass_at_k: error: {old}: no pass@k in it")
    assert not (tmp_path / "x.png").exists()
