"""ebpo_verl.recipes.status_table: the reproduction status table from make_tables' CSVs, paper and our numbers apart,
written by the docs command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ebpo_verl import docs_tables
from ebpo_verl.ops.provenance import provenance
from ebpo_verl.ops.readme_block import markers, replace_marked_block
from ebpo_verl.recipes import make_tables, status_table

ROOT = Path(__file__).resolve().parents[1]

PAGE = "recipe/ebpo/README.md"


def checkout(root: Path) -> Path:
    """A copy of the files the docs command writes (and the study summary it reads) under ``root``."""
    for rel in [docs_tables.YAML, *docs_tables.pages(docs_tables.DocsOptions(), ROOT), "docs/study_quick.json",
                docs_tables.RIVALS2]:  # fmt: skip
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text((ROOT / rel).read_text())
    return root


def _results(path: Path, avg: float, commit: str, command: str) -> str:
    record = {**provenance(seed=0, command=command), "hardware": {"kind": "gpu", "model": "NVIDIA H200", "count": 32}}
    record["ebpo_verl"] = {**record["ebpo_verl"], "commit": commit, "dirty": False}
    benches = {b: {"pass@1": avg, "runs": 16, "complete": True} for b in make_tables.BENCHMARKS}
    data = {"protocol": "paper", "model": "m", "step": 200, "benchmarks": benches, "provenance": record}
    data["generation"] = {"provenance": [record]}
    path.write_text(json.dumps(data))
    return str(path)


def test_status_from_results_regenerates_identically(tmp_path, capsys):
    root = checkout(tmp_path / "root")
    results = root / "results" / "rw_dapo-bl_paper" / "paper"
    ebpo = _results(tmp_path / "ebpo.json", 60.0, "a" * 40, "python -m ebpo_verl.evaluate generate --model x")
    grpo = _results(tmp_path / "grpo.json", 55.0, "b" * 40, "python -m ebpo_verl.evaluate generate --model y")
    make_tables.make_tables([f"Qwen3-8B/EBPO={ebpo}", f"Qwen3-8B/GRPO={grpo}"], results, "main")
    before = (root / PAGE).read_text()
    args = ["--root", str(root), "--results", "results"]
    assert docs_tables.main([*args, "--check"]) == 1  # the committed "not run" block is out of date; nothing written
    assert (root / PAGE).read_text() == before
    assert docs_tables.main(args) == 0
    block = status_table.render(root, ["results"])
    assert (root / PAGE).read_text() == replace_marked_block(before, "status", block)
    assert (
        "| Table 1 (main) | Qwen3-8B | EBPO | 64.39 | 60.00 | paper | 32x NVIDIA H200 | aaaaaaa | "
        "`python -m ebpo_verl.evaluate generate --model x` |" in block
    )
    assert "| Table 1 (main) | Qwen3-8B | GRPO | 58.72 | 55.00 | paper | 32x NVIDIA H200 | bbbbbbb |" in block
    assert (
        "| Table 1 (main) | Qwen3-14B | EBPO | 61.75 | not run | — | — | — | `bash recipe/ebpo/table_main.sh` |"
        in block
    )
    assert "| Table 2 (group size) | G=8 | EBPO | 65.54 | not run |" in block
    assert "| Curriculum (EBPO-diff) | Qwen3-8B-Base | EBPO-diff | 28.12 (authors' logs, step 34) | not run |" in block
    assert "under `results`: 2 measured result(s)" in block
    assert "**Our rows come from different commits (aaaaaaa, bbbbbbb).**" in block
    rows = sum(len(methods) for sections in status_table.PAPER.values() for methods in sections.values())
    assert block.count("\n| ") == rows  # one line per paper row after the header (each has at most one result)
    assert docs_tables.main([*args, "--check"]) == 0  # regenerates identically
    capsys.readouterr()


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    root = checkout(tmp_path)
    good = (root / PAGE).read_text()
    (root / PAGE).write_text("no markers\n")
    assert docs_tables.main(["--root", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m ebpo_verl.docs_tables: error: recipe/ebpo/README.md: block status: ")
    assert f"needs exactly one {markers('status')[0]}" in err and len(err.splitlines()) == 1
    bad = root / "r" / "main.csv"
    bad.parent.mkdir()
    bad.write_text("section,method\nQwen3-8B,EBPO\n")
    (root / PAGE).write_text(good)
    assert docs_tables.main(["--root", str(root), "--results", "r"]) == 2
    err = capsys.readouterr().err.strip()
    assert "main.csv lacks the columns avg, protocol" in err and len(err.splitlines()) == 1
    assert (root / PAGE).read_text() == good


def test_the_block_writer_replaces_one_marked_block_and_refuses_zero_or_two():
    begin, end = markers("x")
    assert (begin, end) == ("<!-- generated:x:begin -->", "<!-- generated:x:end -->")
    text = f"a\n{begin}\nold\n{end}\nb\n"
    assert replace_marked_block(text, "x", "new\n") == f"a\n{begin}\nnew\n{end}\nb\n"
    for bad in ("a\n", text + text, f"see {begin}\nold\n{end}\n"):
        with pytest.raises(ValueError, match="exactly one"):
            replace_marked_block(bad, "x", "new\n")
