"""What a new user meets first: ``ebpo-train --help`` is a page about this entry point, not Hydra's config dump,
listing every option with its default and allowed values (from the declarations), at every level of the command."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from ebpo_verl import main as entry
from ebpo_verl.options.parsing import allowed, shown
from ebpo_verl.trainer.config.generate import ALL_SECTIONS, shown_in_full


def _help(monkeypatch, capsys, *args: str) -> list[str]:
    monkeypatch.setattr(sys, "argv", ["ebpo-train", *args])
    entry.main()
    return capsys.readouterr().out.splitlines()


def test_train_help_opens_with_what_the_entry_point_adds(capsys, monkeypatch):
    """The first line is the usage; every option of every section is listed once with its declared default
    (``null`` for None, as Hydra writes it): a line each with its allowed values for the sections shown in full
    (ebpo, curriculum, trainer), one line per other estimator; then ``--cfg job`` and the docs; a page."""
    out = _help(monkeypatch, capsys, "--help")
    assert out[0].startswith("usage: ebpo-train ") and len(out) < 60
    text = "\n".join(out)
    for cls in ALL_SECTIONS:
        if not shown_in_full(cls):
            folded = " ".join(" ".join(out).split())
            pairs = ", ".join(f"{f.name}={shown(f.default)}" for f in cls.declarations())
            assert f"{cls.SECTION}: {pairs}" in folded
            continue
        listed = [line for line in out if line.startswith(f"  {cls.SECTION}.")]
        assert len(listed) == len(cls.keys())
        for line, f in zip(listed, cls.declarations(), strict=True):
            assert line.startswith(f"  {cls.SECTION}.{f.name}=") and line.endswith(f"  ({allowed(f)})")
    assert "  algorithm.ebpo.cluster_key=null  (null or a label name)" in out
    assert "  trainer.step_timeout_s=3600  (null or a number of seconds >= 0 (0: off))" in out
    assert "ebpo-train --cfg job" in text and "docs/estimator.md" in text and "ppo_trainer:" not in text
    assert "recipes run|table|eval --help" not in text  # no pointer to a command that fails


@pytest.mark.parametrize("args", [("-h",), ("--cfg", "job", "--help"), ("trainer.total_epochs=1", "--help")])
def test_every_level_answers_help(capsys, monkeypatch, args):
    assert _help(monkeypatch, capsys, *args)[0].startswith("usage: ebpo-train ")


def test_readme_and_data_page_run_data_prep_scripts_that_exist():
    """The README (its layout and the CPU evaluation) and docs/data.md send a user to the top-level data_prep/
    folder: every ``data_prep/<name>.py`` they run is there."""
    root = Path(__file__).resolve().parents[1]
    for page in ("README.md", "docs/data.md"):
        named = set(re.findall(r"data_prep/(\w+)\.py", (root / page).read_text()))
        assert named and all((root / "data_prep" / f"{name}.py").is_file() for name in named), (page, named)
    assert "`data_prep/`" in (root / "README.md").read_text()
