"""ebpo_verl.recipes.status_table: the reproduction status table from make_tables' CSVs, paper and our numbers apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ebpo_verl.ops.provenance import provenance
from ebpo_verl.recipes import make_tables, status_table

ROOT = Path(__file__).resolve().parents[1]

README = f"# page\n\nintro\n\n{status_table.BEGIN}\nold\n{status_table.END}\n\nrest\n"


def _results(path: Path, avg: float, commit: str, command: str) -> str:
    record = {**provenance(seed=0, command=command), "hardware": {"kind": "gpu", "model": "NVIDIA H200", "count": 32}}
    record["ebpo_verl"] = {**record["ebpo_verl"], "commit": commit, "dirty": False}
    benches = {b: {"pass@1": avg, "runs": 16, "complete": True} for b in make_tables.BENCHMARKS}
    data = {"protocol": "paper", "model": "m", "step": 200, "benchmarks": benches, "provenance": record}
    data["generation"] = {"provenance": [record]}
    path.write_text(json.dumps(data))
    return str(path)


def test_status_from_results_regenerates_identically(tmp_path, capsys):
    results = tmp_path / "results" / "rw_dapo-bl_paper" / "paper"
    ebpo = _results(tmp_path / "ebpo.json", 60.0, "a" * 40, "python -m ebpo_verl.evaluate generate --model x")
    grpo = _results(tmp_path / "grpo.json", 55.0, "b" * 40, "python -m ebpo_verl.evaluate generate --model y")
    make_tables.make_tables([f"Qwen3-8B/EBPO={ebpo}", f"Qwen3-8B/GRPO={grpo}"], results, "main")
    readme = tmp_path / "README.md"
    readme.write_text(README)
    args = [str(tmp_path / "results"), "--readme", str(readme)]
    assert status_table.main([*args, "--check"]) == 1  # the placeholder is out of date; nothing written
    assert readme.read_text() == README
    assert status_table.main([*args, "--out", str(tmp_path / "status.md")]) == 0
    text = readme.read_text()
    block = (tmp_path / "status.md").read_text()
    assert text == README.replace("old\n", block)
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
    assert "2 measured result(s)" in block and "**Our rows come from different commits (aaaaaaa, bbbbbbb).**" in block
    rows = sum(len(methods) for sections in status_table.PAPER.values() for methods in sections.values())
    assert block.count("\n| ") == rows  # one line per paper row after the header (each has at most one result)
    assert status_table.main([*args, "--check"]) == 0  # regenerates identically
    capsys.readouterr()


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    assert status_table.main([str(tmp_path), "--readme", str(readme)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("status_table: error: ") and "needs exactly one <!-- status:begin -->" in err
    bad = tmp_path / "r" / "main.csv"
    bad.parent.mkdir()
    bad.write_text("section,method\nQwen3-8B,EBPO\n")
    readme.write_text(README)
    assert status_table.main([str(tmp_path / "r"), "--readme", str(readme)]) == 2
    err = capsys.readouterr().err.strip()
    assert "main.csv lacks the columns avg, protocol" in err and len(err.splitlines()) == 1
    assert readme.read_text() == README


def test_recipe_readme_block_is_current(monkeypatch):
    """recipe/ebpo/README.md's status block is what the command writes from the default results folder (both
    defaults are under the current folder: the checkout's root)."""
    monkeypatch.chdir(ROOT)
    assert status_table.main(["--check"]) == 0


def test_the_block_writer_replaces_one_marked_block_and_refuses_zero_or_two():
    from ebpo_verl.ops.readme_block import replace_marked_block

    text = "a\n<!-- x:begin -->\nold\n<!-- x:end -->\nb\n"
    assert replace_marked_block(text, "<!-- x:begin -->", "<!-- x:end -->", "new\n") == (
        "a\n<!-- x:begin -->\nnew\n<!-- x:end -->\nb\n"
    )
    for bad in ("a\n", text + text, "see <!-- x:begin -->\nold\n<!-- x:end -->\n"):
        with pytest.raises(ValueError, match="exactly one"):
            replace_marked_block(bad, "<!-- x:begin -->", "<!-- x:end -->", "new\n")
