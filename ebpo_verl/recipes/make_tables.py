"""Tables of Pass@1 (or pass@K, maj@K, avg@n) from evaluation results or EBPO/verl metrics logs, in the paper's layout.

    python -m ebpo_verl.recipes.make_tables RUN... --out results/ [--table NAME] [--select final|best] [--metric M ...]

RUN: a RESULTS.json of ``python -m ebpo_verl.evaluate grade`` (row protocol: its ``protocol``, paper or verl), a
metrics log (verl's file-logger format, as ``trainer.metrics_log_path`` writes; protocol ``validation``) or a run
directory (its ``metrics.jsonl``, else its ``*.jsonl`` in natural order as attempts: :func:`read_run`), labelled
``SECTION/METHOD=RUN`` (else the row ``runs/<name>``). Scores: ``val-core/<benchmark>/acc/mean@k`` (largest k) x
100; ``--select best`` takes the validation with the highest five-benchmark average (a ceiling: checkpoint
selection on the test sets). Avg is empty unless all five benchmarks are there, and so is a cell whose benchmark
lacks the ``--metric`` (pass@K / maj@K / avg@n: RESULTS.json rows only, docs/evaluation.md#coverage; a note names
them). The paper's numbers (pass@1) show only beside ``paper``-protocol rows and rows not run yet
(docs/paper_notes.md#evaluation). Writes ``<out>/<table>[-<metric>].md`` and ``.csv``; with ``--table`` every row
of the paper's table is listed, with its reference rows ("(paper)", or the curriculum's authors' logs: paper.py).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import sys
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import ClassVar

from ebpo_verl.ops.atomic import atomic_write_text
from ebpo_verl.ops.errors import shorten
from ebpo_verl.ops.metrics_log import MetricsLogError, merge_attempts, read_provenance, read_records
from ebpo_verl.ops.provenance import describe_hardware, short_commit
from ebpo_verl.options.cli import parse
from ebpo_verl.options.parsing import OptionSection, option, text
from ebpo_verl.recipes.paper import BENCHMARKS, CONTRASTS, PAPER, PAPER_LABEL
from ebpo_verl.recipes.tables import TABLES

METRIC = re.compile(r"^(?:(?P<name>pass|maj)@(?P<k>[1-9]\d*)|avg@n)$")
DEFAULT_METRIC = "pass@1"
VAL_KEY = re.compile(r"^val-core/(?P<bench>.+)/acc/mean@(?P<k>\d+)$")
SELECT = ("final", "best")
ADHOC_SECTION = "runs"
PROTOCOLS = {
    "paper": "the authors' evaluation (raw prompt, Answer: grader, 16 runs / OlympiadBench 4; docs/paper_notes.md)",
    "verl": "chat template + math-verify reward, 16 runs (ebpo_verl.evaluate)",
    "validation": "verl's validation during training (metrics log; the run's own response length and samples)",
}


def _natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def log_files(path: Path) -> list[Path]:
    """The log files of a run path, in attempt order (empty when there is nothing to read)."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []
    if (path / "metrics.jsonl").is_file():
        return [path / "metrics.jsonl"]
    # `<stem>.superseded-*.jsonl` hold lines the package's log moved aside on a resume: not part of the run
    return sorted((p for p in path.glob("*.jsonl") if ".superseded-" not in p.name), key=_natural_key)


def read_run(path: str | os.PathLike) -> dict[int, dict]:
    """Step -> metrics of one run, its attempts (restarts) resolved by ``merge_attempts`` (a torn last line skipped
    with a warning, another malformed line an error naming file and line); {} if nothing is there."""
    return merge_attempts(record for file in log_files(Path(path)) for record in read_records(file))


def finite_number(value) -> float | None:
    """``value`` as a float if it is an int or float (not a bool) whose float is finite, else None (NaN, the
    infinities and integers past float's range, such as a 400-digit one)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def val_scores(metrics: dict) -> tuple[dict[str, float], set[int]]:
    """Benchmark -> Pass@1 in percent from one step's metrics (largest k per benchmark), and the ks used."""
    best: dict[str, tuple[int, float]] = {}
    for key, value in metrics.items():
        match = VAL_KEY.match(key)
        number = finite_number(value)
        if match is None or number is None or match["bench"] not in BENCHMARKS:
            continue
        k = int(match["k"])
        if match["bench"] not in best or k > best[match["bench"]][0]:
            best[match["bench"]] = (k, 100.0 * number)
    return {bench: score for bench, (_, score) in best.items()}, {k for k, _ in best.values()}


def average(scores: dict[str, float]) -> float | None:
    """Mean over the five benchmarks, None unless all five are present."""
    if any(bench not in scores for bench in BENCHMARKS):
        return None
    return sum(scores[bench] for bench in BENCHMARKS) / len(BENCHMARKS)


@dataclass
class Row:
    section: str
    method: str
    source: str = ""
    scores: dict[str, float] = field(default_factory=dict)
    step: int | None = None
    ks: set[int] = field(default_factory=set)
    paper: dict[str, float] = field(default_factory=dict)
    missing: str = ""
    protocol: str = ""  # paper | verl | validation; "" while the row has no result
    paper_label: str = "paper"  # where ``paper`` comes from (PAPER_LABEL)
    more_refs: list[tuple[str, dict[str, float]]] = field(default_factory=list)  # further labelled references
    # provenance records of what produced the row's numbers (generate runs + grading, or the log's attempts)
    records: list[dict] = field(default_factory=list)
    hardware_records: list[dict] = field(default_factory=list)  # where the model ran (generation / training)
    coverage: dict[str, str] = field(default_factory=dict)  # benchmark -> what a partial result covered
    metric: str = DEFAULT_METRIC  # what the score cells hold
    absent: list[str] = field(default_factory=list)  # benchmarks evaluated whose results lack the metric

    @property
    def commits(self) -> list[str]:
        """Short commits (``+dirty`` marked) of the code that produced the row, in order; [] if unrecorded."""
        return list(dict.fromkeys(short_commit(r) for r in self.records))

    @property
    def hardware(self) -> str:
        found = list(dict.fromkeys(describe_hardware(r) for r in self.hardware_records or self.records))
        return " / ".join(found) if found else "not recorded"

    @property
    def command(self) -> str:
        """The command that produced the row's numbers: the last training attempt or the generate run."""
        source = self.hardware_records or self.records
        return str(source[-1].get("command", "")) if source else ""

    @property
    def shows_paper(self) -> bool:
        """The paper's numbers go beside paper-protocol results (and rows without a result) only."""
        return self.protocol in ("paper", "") and self.metric == DEFAULT_METRIC

    @property
    def avg(self) -> float | None:
        return average(self.scores)


def select_validation(run: dict[int, dict], how: str) -> tuple[int, dict[str, float], set[int]] | None:
    """(step, scores, ks) of the run's final or best validation; None when there is none."""
    validations = [(step, *val_scores(data)) for step, data in run.items()]
    validations = [v for v in validations if v[1]]
    if how == "final":
        return validations[-1] if validations else None
    complete = [v for v in validations if average(v[1]) is not None]
    return max(complete, key=lambda v: (average(v[1]), v[0])) if complete else None


RESULT_COUNTS = ("runs", "problems", "problems_in_data", "samples", "n", "limit")
"""A benchmark entry's counts in a RESULTS.json: integers >= 0 (or null)."""
RESULT_PERCENTS = ("pass@1", "avg@n")
"""Its single scores: percentages in [0, 100] (or null)."""


def load_results(path: Path) -> dict:
    """A RESULTS.json of ``python -m ebpo_verl.evaluate grade``, its structure checked: ``protocol`` paper or verl,
    ``benchmarks`` an object of objects whose counts are integers >= 0 and whose scores (``pass@1``, ``avg@n``,
    ``pass@k``/``maj@k`` by k) are percentages, ``complete`` a boolean, ``step`` an integer or null,
    ``generation`` an object or null. MetricsLogError naming the file and the first bad field otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError(f"a JSON {type(data).__name__}, not an object")
        if data.get("protocol") not in ("paper", "verl") or not isinstance(data.get("benchmarks"), dict):
            raise TypeError(
                f"protocol {shorten(data.get('protocol'))} / benchmarks {type(data.get('benchmarks')).__name__}"
            )
        step, generation = data.get("step"), data.get("generation")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise TypeError(f"step {shorten(step)} is not an integer")
        if generation is not None and not (
            isinstance(generation, dict) and isinstance(generation.get("provenance", []), list)
        ):
            raise TypeError("generation is not an object with a provenance list")
        for bench, entry in data["benchmarks"].items():
            _check_result_entry(bench, entry)
    except (ValueError, KeyError, TypeError, RecursionError, OverflowError) as err:  # Overflow: a 400-digit score
        why = "nested too deeply" if isinstance(err, RecursionError) else " ".join(str(err).split())
        raise MetricsLogError(f"{path}: not a RESULTS.json of python -m ebpo_verl.evaluate grade ({why})") from err
    return data


def _check_result_entry(bench: str, entry: object) -> None:
    if not isinstance(entry, dict):
        raise TypeError(f"benchmarks.{bench:.40} is not an object")
    for key in RESULT_COUNTS:
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise TypeError(f"benchmarks.{bench:.40}.{key}={shorten(value)} is not an integer >= 0")
    if not all(entry.get(name) is None or isinstance(entry[name], dict) for name in ("pass@k", "maj@k")):
        raise TypeError(f"benchmarks.{bench:.40}.pass@k/maj@k is not an object (k -> percentage)")
    by_k = [(f"{name}.{k:.20}", v) for name in ("pass@k", "maj@k") for k, v in (entry.get(name) or {}).items()]
    for key, value in [(k, entry.get(k)) for k in RESULT_PERCENTS] + by_k:
        if value is not None and (finite_number(value) is None or not 0 <= value <= 100):
            raise TypeError(f"benchmarks.{bench:.40}.{key}={shorten(value)} is not a percentage")
    if not isinstance(entry.get("complete", True), bool):
        raise TypeError(f"benchmarks.{bench:.40}.complete is not true or false")


def check_metric(metric: str) -> str:
    if not METRIC.match(metric):
        raise ValueError(f"unknown metric {metric!r}: expected pass@K, maj@K (K = 1, 2, 4, ..., n) or avg@n")
    return metric


def metric_value(entry: dict, metric: str) -> float | None:
    """A benchmark entry's value of ``metric`` (None when it lacks it)."""
    match = METRIC.match(metric)
    if metric == DEFAULT_METRIC or match is None:
        return finite_number(entry.get("pass@1"))
    if match["name"] is None:
        return finite_number(entry.get("avg@n"))
    by_k = entry.get(f"{match['name']}@k")
    return finite_number(by_k.get(match["k"])) if isinstance(by_k, dict) else None


def scores_of(data: dict, metric: str) -> dict[str, float]:
    """Benchmark -> ``metric`` of a RESULTS.json's benchmarks that have it."""
    values = {b: metric_value(v, metric) for b, v in data["benchmarks"].items() if b in BENCHMARKS}
    return {b: value for b, value in values.items() if value is not None}


def results_coverage(data: dict) -> dict[str, str]:
    """Benchmark -> what it covered, for the benchmarks of a RESULTS.json that are partial: ``--limit N`` (the
    first N problems: "4/30 problems") or graded with ``--allow-partial`` ("70/80 samples")."""
    out = {}
    for bench, v in data["benchmarks"].items():
        notes = []
        if isinstance(v.get("problems_in_data"), int) and (v.get("problems") or 0) < v["problems_in_data"]:
            notes.append(f"{v.get('problems') or 0}/{v['problems_in_data']} problems")
        if v.get("complete") is False:
            notes.append(f"{v.get('samples')}/{(v.get('problems') or 0) * (v.get('runs') or 0)} samples")
        if notes and bench in BENCHMARKS:
            out[bench] = ", ".join(notes)
    return out


def fill(row: Row, path: str, how: str) -> None:
    """Read the run or RESULTS.json at ``path`` into ``row`` (or say why it stays empty)."""
    row.source = path
    if path.endswith(".json") and Path(path).is_file():
        data = load_results(Path(path))
        benches = data["benchmarks"]
        row.protocol, row.step, row.scores = data["protocol"], data.get("step"), scores_of(data, row.metric)
        row.ks = {v["runs"] for b, v in benches.items() if b in row.scores and v.get("runs") is not None}
        evaluated = scores_of(data, DEFAULT_METRIC)  # pass@1: the benchmarks that were evaluated
        row.absent = [b for b in BENCHMARKS if b in evaluated and b not in row.scores]
        if evaluated and not row.scores:
            row.missing = f"no {row.metric} in the results"
        # provenance (none in a file written before it was recorded): the generate runs' (where the model ran),
        # then the grading's
        generation = [r for r in (data.get("generation") or {}).get("provenance", []) if isinstance(r, dict)]
        grading = [data["provenance"]] if isinstance(data.get("provenance"), dict) else []
        row.records, row.hardware_records = generation + grading, generation
        row.coverage = results_coverage(data)
        if not all(v.get("complete", True) for v in benches.values()):
            row.missing = "incomplete: graded with --allow-partial"
        return
    if path.endswith(".json"):
        row.missing = "no results file"
        return
    if not log_files(Path(path)):
        row.missing = "no metrics log"
        return
    if row.metric != DEFAULT_METRIC:
        row.missing = f"a metrics log holds pass@1 only, not {row.metric}"
        return
    chosen = select_validation(read_run(path), how)
    if chosen is None:
        row.missing = "no validation with all five benchmarks" if how == "best" else "no validation metrics"
        return
    row.step, row.scores, row.ks = chosen
    row.protocol = "validation"
    row.records = [a["provenance"] for file in log_files(Path(path)) for a in read_provenance(file)]


def parse_spec(spec: str) -> tuple[str, str, str]:
    """``SECTION/METHOD=PATH``, ``METHOD=PATH`` or ``PATH`` -> (section, method, path)."""
    if "=" in spec and not Path(spec).exists():
        label, path = spec.split("=", 1)
        section, _, method = label.rpartition("/")
        if not method or not path:
            raise ValueError(f"bad run label {spec!r}: expected SECTION/METHOD=PATH, METHOD=PATH or PATH")
        return section or ADHOC_SECTION, method, path
    name = Path(spec.rstrip("/")).name
    return ADHOC_SECTION, name.removesuffix(".jsonl"), spec


def build_rows(table: str | None, specs: list[str], how: str, metric: str = DEFAULT_METRIC) -> list[Row]:
    """The table's rows: the paper's layout (for a named table) filled from the runs, then extra runs."""
    label = PAPER_LABEL.get(table, "paper")
    rows = {
        (section, method): Row(
            section, method, paper=dict(numbers), missing="not run", paper_label=label, metric=metric
        )
        for section, methods in PAPER.get(table, {}).items()
        for method, numbers in methods.items()
    }
    seen = set()
    for spec in specs:
        section, method, path = parse_spec(spec)
        if (section, method) in seen:
            raise ValueError(f"two runs for the row {section}/{method}: label them differently")
        seen.add((section, method))
        if (section, method) not in rows and not Path(path).exists():
            raise ValueError(f"{path}: no such file or folder (only a row of the --table's layout may be not run yet)")
        row = rows.setdefault((section, method), Row(section, method, metric=metric))
        row.missing = ""
        fill(row, path, how)
    order = list(dict.fromkeys(section for section, _ in rows))
    return sorted(rows.values(), key=lambda r: order.index(r.section))


def contrast_rows(table: str | None, rows: list[Row]) -> list[Row]:
    """Differences the paper reports (method minus method): ours per benchmark, and the paper's numbers."""
    by_key = {(r.section, r.method): r for r in rows}
    out = []
    for section, pairs in CONTRASTS.get(table, {}).items():
        for plus, minus, refs in pairs:
            a, b = by_key.get((section, plus)), by_key.get((section, minus))
            diff = {
                bench: a.scores[bench] - b.scores[bench]
                for bench in BENCHMARKS
                if a is not None and b is not None and bench in a.scores and bench in b.scores
            }
            protocols = {r.protocol for r in (a, b) if r is not None} - {""}
            protocol = "mixed" if len(protocols) > 1 else protocols.pop() if protocols else ""
            if protocol == "mixed":  # a difference across protocols means nothing: left empty
                diff = {}
            (label, paper), *more = refs.items()
            row = Row(section, f"{plus} − {minus}", scores=diff, paper=dict(paper), protocol=protocol)
            row.metric = a.metric if a is not None else DEFAULT_METRIC
            row.paper_label, row.more_refs = label, more
            out.append(row)
    return out


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return ""
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def render_markdown(title: str, rows: list[Row], contrasts: list[Row]) -> str:
    head = ["Section", "Method", *BENCHMARKS.values(), "Avg", "Paper Avg", "Δ Avg", "Step", "Protocol", "Numbers"]
    used = sorted({r.protocol for r in rows if r.protocol})
    legend = [f"- {p}: {PROTOCOLS[p]}" for p in used]
    metric = rows[0].metric if rows else DEFAULT_METRIC
    if metric != DEFAULT_METRIC:
        legend.append(f"- the paper reports pass@1 only: no paper numbers beside {metric}")
    elif any(r.protocol and not r.shows_paper for r in rows):
        legend.append("- the paper's numbers are shown only beside paper-protocol results")
    lines = [f"# {title}", "", *legend, *([""] if legend else []), "| " + " | ".join(head) + " |"]
    lines.append("|" + "---|" * len(head))

    def emit(cells: list[str]) -> None:
        lines.append("| " + " | ".join(cells) + " |")

    for row in rows:
        paper_avg, delta = _paper_avg(row)
        scores = [_fmt(row.scores.get(b)) + (f" ({row.coverage[b]})" if b in row.coverage else "") for b in BENCHMARKS]
        avg = _fmt(row.avg) + (" (partial)" if row.coverage and row.avg is not None else "")
        emit(
            [row.section, row.method, *scores, avg, _fmt(paper_avg), _fmt(delta, True), _fmt_step(row)]
            + [row.protocol, _numbers(row)]
        )
        if row.shows_paper and any(b in row.paper for b in BENCHMARKS):
            paper = [_fmt(row.paper.get(b)) for b in BENCHMARKS]
            emit(["", f"{row.method} ({row.paper_label})", *paper, "", "", "", "", "", REFERENCE])
    for row in contrasts:
        cells = [_fmt(row.scores.get(b), True) for b in BENCHMARKS]
        emit([row.section, row.method, *cells, "", "", "", "", row.protocol, "ours" if row.scores else ""])
        if row.shows_paper:
            for label, ref in [(row.paper_label, row.paper), *row.more_refs]:
                cells = [_fmt(ref.get(b), True) for b in BENCHMARKS]
                emit(["", f"{row.method} ({label})", *cells, "", "", "", "", "", REFERENCE])
    notes = [  # (what a row it names says, the note's start and end), for the rows that have it
        (lambda r: r.missing and r.missing + (f": {r.source}" if r.source else ""), "Empty rows: ", "."),
        (
            lambda r: ", ".join(BENCHMARKS[b] for b in r.absent),
            f"**No {metric} in the results** of ",
            ": k above that benchmark's samples per problem, or graded before coverage was reported (grade again)."
            " Their cells and Avg are empty.",
        ),
        (
            _coverage,
            "**Partial results, not comparable with full-benchmark numbers**: ",
            ". (N/M problems: evaluated with --limit N; k/n samples: graded with --allow-partial.)",
        ),
    ]
    for what, start, end in notes:
        if named := [f"{r.section}/{r.method} ({what(r)})" for r in rows if what(r)]:
            lines += ["", start + "; ".join(named) + end]
    return "\n".join(lines + provenance_footer(rows)) + "\n"


REFERENCE = "**PAPER, not ours**"
"""The Numbers cell of a reference row (the paper's, or the authors' logged, numbers)."""


def _numbers(row: Row) -> str:
    """Whose numbers a row holds (ours: measured by this package; the paper's are in the Paper Avg cell only)."""
    if row.scores:
        return "ours, partial" if row.coverage else "ours"
    return "not run"


def _coverage(row: Row) -> str:
    return "; ".join(f"{BENCHMARKS[b]} {note}" for b, note in row.coverage.items())


def provenance_footer(rows: list[Row]) -> list[str]:
    """Lines under a table: which numbers are the paper's, and the commit, hardware and command of each of our
    rows, with a warning when they come from different commits or record none."""
    ours = [r for r in rows if r.scores]
    lines = [
        "",
        'Numbers: "ours" rows were measured by this package; rows marked **PAPER, not ours** (and the Paper Avg '
        "column) are the numbers reported by Han et al. (arXiv 2602.05165) or the authors' logs, never ours.",
    ]
    if not ours:
        return lines
    lines += ["", "Provenance of our rows (ebpo-verl commit; hardware; command):"]
    for r in ours:
        commits = ", ".join(r.commits) or "not recorded"
        command = f"; `{r.command}`" if r.command else ""
        lines.append(f"- {r.section}/{r.method}: commit {commits}; {r.hardware}{command}")
    commits = sorted({c for r in ours for c in r.commits})
    unrecorded = [f"{r.section}/{r.method}" for r in ours if not r.records]
    if len(commits) > 1:
        lines += [
            "",
            f"**Rows come from different commits ({', '.join(commits)}): differences between them may be"
            " code changes, not the methods.**",
        ]
    if unrecorded:
        lines += [
            "",
            f"**No provenance recorded for {', '.join(unrecorded)}** (written before provenance was "
            "recorded, or without this package's tools): their commit and hardware are unknown.",
        ]
    return lines


def _paper_avg(row: Row) -> tuple[float | None, float | None]:
    """(paper's average, ours minus it) where the paper's numbers may be shown beside the row."""
    paper_avg = row.paper.get("avg") if row.shows_paper else None
    delta = row.avg - paper_avg if row.avg is not None and paper_avg is not None else None
    return paper_avg, delta


def _fmt_step(row: Row) -> str:
    return "" if row.step is None else str(row.step)


def render_csv(rows: list[Row], contrasts: list[Row]) -> str:
    head = ["section", "method", *BENCHMARKS, "avg", *[f"paper_{b}" for b in BENCHMARKS], "paper_avg"]
    head += ["diff_avg", "step", "k", "source", "missing", "protocol", "numbers", "commit", "hardware", "command"]
    head += ["coverage"]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(head)
    for row, is_contrast in [(r, False) for r in rows] + [(r, True) for r in contrasts]:
        paper_avg, delta = _paper_avg(row)
        paper = [_fmt(row.paper.get(b)) if row.shows_paper else "" for b in BENCHMARKS]
        writer.writerow(
            [row.section, row.method, *[_fmt(row.scores.get(b)) for b in BENCHMARKS], _fmt(row.avg)]
            + paper
            + [_fmt(paper_avg), _fmt(delta), _fmt_step(row), ",".join(map(str, sorted(row.ks)))]
            + [row.source, row.missing, row.protocol, ("ours" if row.scores else "") if is_contrast else _numbers(row)]
            + [" ".join(row.commits), row.hardware if row.records else "", row.command, _coverage(row)]
        )
    return buf.getvalue()


def make_tables(
    specs: list[str], out: Path, table: str | None = None, how: str = "final", metric: str = DEFAULT_METRIC
) -> Path:
    """Write ``<out>/<table>.md`` and ``.csv`` (``<table>-<metric>.*`` for a metric other than pass@1); returns
    the markdown path."""
    if how not in SELECT:
        raise ValueError(f"select={how!r}: expected one of {SELECT}")
    rows = build_rows(table, specs, how, check_metric(metric))
    contrasts = contrast_rows(table, rows)
    name = table or ADHOC_SECTION
    protocols = sorted({r.protocol for r in rows if r.protocol})
    what = ", ".join(f"{p} ({how})" if p == "validation" else p for p in protocols) or "no results yet"
    title = f"{name}: {'Pass@1' if metric == DEFAULT_METRIC else metric} (%), protocol: {what}"
    name += "" if metric == DEFAULT_METRIC else f"-{metric}"
    md = out / f"{name}.md"
    atomic_write_text(md, render_markdown(title, rows, contrasts))
    atomic_write_text(out / f"{name}.csv", render_csv(rows, contrasts))
    return md


@dataclass(frozen=True)
class MakeTablesOptions(OptionSection):
    """The options of ``python -m ebpo_verl.recipes.make_tables``, its RUN arguments included, declared once."""

    SECTION: ClassVar[str] = "make_tables"

    out: str = option(MISSING, "output directory", rule=text("a folder"))
    table: str | None = option(
        None,
        "lay the rows out as this table (the paper's, if any); null: one row per run",
        choices=(None, *sorted(TABLES)),
    )
    select: str = option("final", "which validation of a run the table reports", choices=SELECT)
    metric: tuple[str, ...] = option(
        (DEFAULT_METRIC,),
        "pass@1, pass@K, maj@K, avg@n: one table per metric (RESULTS.json rows)",
        rule=text("a metric"),
        metavar="M",
    )
    runs: tuple[str, ...] = option((), "[SECTION/METHOD=]metrics log or run directory", rule=text("a run"), flag="RUN")

    def __post_init__(self) -> None:
        if not self.runs and not self.table:
            raise ValueError("give runs, or --table to print the paper's table with empty cells")


def main(argv: list[str] | None = None) -> int:
    o = parse(MakeTablesOptions, "python -m ebpo_verl.recipes.make_tables", argv, __doc__.split("\n\n")[0])
    try:
        mds = [make_tables(o.runs, Path(o.out), o.table, o.select, m) for m in dict.fromkeys(o.metric)]
    except (MetricsLogError, ValueError, OSError) as err:
        print(f"make_tables: error: {err}", file=sys.stderr)
        return 1
    print("\n".join(md.read_text(encoding="utf-8") for md in mds), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
