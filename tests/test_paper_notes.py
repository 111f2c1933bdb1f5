"""docs/paper_notes.md, the repository's notes on the paper: every section that code and docs cite exists, and no
tracked file points at the internal summary the notes replaced (it is not part of the repository)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTES = ROOT / "docs" / "paper_notes.md"
OLD_SUMMARY = "PAPER" + ".md"  # spelled in two parts so that this file does not name it


def _tracked_texts() -> dict[str, str]:
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    texts = {}
    for name in listed.stdout.splitlines():
        path = ROOT / name
        if path.suffix in {".py", ".md", ".sh", ".yaml", ".toml", ""} and path.is_file():
            try:
                texts[name] = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
    return texts


def _sections() -> set[str]:
    """GitHub's anchors of the notes' headings (lower case, spaces to dashes, punctuation dropped)."""
    headings = re.findall(r"^#{2,4} (.+)$", NOTES.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_cited_sections_exist():
    sections = _sections()
    assert {"estimator", "released-code", "fork-baselines", "evaluation", "logged-numbers"} <= sections
    cited: dict[str, set[str]] = {}
    for name, text in _tracked_texts().items():
        for line in text.splitlines():
            if "paper_notes.md" not in line and name != "docs/paper_notes.md":
                continue
            # docs/paper_notes.md#x, and the further "#y" of the same citation ("#training-reward and #evaluation")
            for anchor in re.findall(r"(?:paper_notes\.md|[\s(])#([a-z][a-z0-9-]+)", line):
                cited.setdefault(anchor, set()).add(name)
    assert cited, "no citation of docs/paper_notes.md found"
    missing = {a: sorted(files) for a, files in cited.items() if a not in sections}
    assert not missing, f"sections cited but not in docs/paper_notes.md: {missing}"


def test_no_tracked_file_points_at_the_old_summary():
    hits = [name for name, text in _tracked_texts().items() if OLD_SUMMARY in text]
    assert not hits, f"{OLD_SUMMARY} is not in the repository; cite docs/paper_notes.md#<section> in {hits}"
