"""The reproduction status table: per row of the paper's tables, the paper's number and ours (or "not run").

The docs command (``python -m ebpo_verl.docs_tables [--results DIR ...]``) writes it into
``recipe/ebpo/README.md``'s ``status`` block. The results folders (default ``ebpo_runs/results`` under the checkout,
where the table drivers write) are searched recursively for the ``<table>.csv`` files that
``python -m ebpo_verl.recipes.make_tables --table <table>`` writes (one folder per reward/baseline variant and
protocol). Every row of :mod:`ebpo_verl.recipes.paper` gets one line per measured result found (its five-benchmark
average, protocol, hardware, ebpo-verl commit and command, as make_tables read them from the results'
provenance), or one "not run" line naming the table driver that would produce it. The paper's numbers and ours are
in separate columns, never mixed. Bad input (an unreadable CSV, a CSV without make_tables' columns) is
:class:`StatusError`, one line naming the file and the fix.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ebpo_verl.recipes.paper import PAPER, PAPER_LABEL

TABLE_NAMES = {
    "main": "Table 1 (main)",
    "group_size": "Table 2 (group size)",
    "ordering": "Table 3 (ordering)",
    "curriculum": "Curriculum (EBPO-diff)",
    "grpo_bn": "GRPO+BN ablation",
}
"""Paper table -> the label the status table prints."""
NEEDED = ("section", "method", "avg", "protocol", "numbers", "commit", "hardware", "command")


class StatusError(ValueError):
    """Bad input: the message names the file and the fix."""


@dataclass(frozen=True)
class Measured:
    """One of our results for a paper row, as make_tables wrote it."""

    avg: str
    protocol: str
    hardware: str
    commit: str
    command: str
    source: Path


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of one make_tables CSV; StatusError naming the file when it is not one."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
            fields = rows[0].keys() if rows else []
    except (OSError, csv.Error, UnicodeDecodeError) as err:
        raise StatusError(f"cannot read {path}: {err}") from err
    missing = [k for k in NEEDED if rows and k not in fields]
    if missing:
        raise StatusError(
            f"{path} lacks the columns {', '.join(missing)}: regenerate it with "
            "python -m ebpo_verl.recipes.make_tables --table"
        )
    return rows


def collect(dirs: list[Path]) -> dict[tuple[str, str, str], list[Measured]]:
    """(table, section, method) -> our measured results, from every ``<table>.csv`` under ``dirs`` (sorted)."""
    found: dict[tuple[str, str, str], list[Measured]] = {}
    for folder in dirs:
        for table in PAPER:
            for path in sorted(folder.rglob(f"{table}.csv")) if folder.is_dir() else []:
                for row in read_csv(path):
                    if row["numbers"] != "ours" or not row["avg"]:
                        continue
                    measured = Measured(
                        row["avg"], row["protocol"], row["hardware"], row["commit"], row["command"], path
                    )
                    found.setdefault((table, row["section"], row["method"]), []).append(measured)
    return found


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or "—"


def render(root: Path, results: Sequence[str]) -> str:
    """The status table (markdown) of the results under the folders ``results`` (relative to ``root``) with a line
    saying where it was read from."""
    found = collect([root / r for r in results])
    head = ["Paper table", "Section", "Row", "Paper (avg)", "Ours (avg)", "Protocol", "Hardware", "Commit", "Command"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ours = 0
    for table, sections in PAPER.items():
        driver, name = f"`bash recipe/ebpo/table_{table}.sh`", TABLE_NAMES.get(table, table)
        label = PAPER_LABEL.get(table, "paper")
        for section, methods in sections.items():
            for method, numbers in methods.items():
                avg = numbers.get("avg")  # a row the paper does not run (e.g. a stock-verl competitor): none
                paper = (
                    "not in the paper" if avg is None else f"{avg:.2f}" + ("" if label == "paper" else f" ({label})")
                )
                measured = found.get((table, section, method), [])
                ours += len(measured)
                if not measured:
                    cells = [name, section, method, paper, "not run", "—", "—", "—", driver]
                    lines.append("| " + " | ".join(cells) + " |")
                for m in measured:
                    cells = [name, section, method, paper, m.avg, m.protocol, m.hardware, m.commit]
                    lines.append("| " + " | ".join(_cell(c) for c in cells) + f" | `{_cell(m.command)}` |")
    where = ", ".join(f"`{r}`" for r in results)
    commits = sorted({m.commit for ms in found.values() for m in ms if m.commit})
    note = [
        "",
        f"Generated by `python -m ebpo_verl.docs_tables` from the make_tables CSVs under {where}: {ours} "
        "measured result(s). Paper (avg): the paper's five-benchmark average (arXiv 2602.05165), never ours; "
        "Ours (avg): measured by this package (Protocol: `paper` = the authors' evaluation, `verl` = chat template + "
        "math-verify, `validation` = verl's validation during training).",
    ]
    if len(commits) > 1:
        note += ["", f"**Our rows come from different commits ({', '.join(commits)}).**"]
    return "\n".join(lines + note) + "\n"
