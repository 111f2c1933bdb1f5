"""What a new user meets first: ``ebpo-train --help`` is a page about this entry point, not Hydra's config dump."""

from __future__ import annotations

import sys

from ebpo_verl import main as entry
from ebpo_verl.algos.baselines import SPO_OPTION_KEYS
from ebpo_verl.algos.ebpo import OPTION_KEYS


def test_train_help_opens_with_what_the_entry_point_adds(capsys, monkeypatch):
    """The first line names the entry point; every algorithm.ebpo / algorithm.spo key is listed once with a
    default (``null`` for None, as Hydra writes it), then ``--cfg job`` and the docs; a page, not 1,100 lines."""
    monkeypatch.setattr(sys, "argv", ["ebpo-train", "--help"])
    entry.main()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ebpo-train / python -m ebpo_verl.main") and len(out) < 50
    for block, keys in (("ebpo", OPTION_KEYS), ("spo", SPO_OPTION_KEYS)):
        listed = [line.strip().split("=", 1) for line in out if line.startswith(f"  algorithm.{block}.")]
        assert sorted(k.removeprefix(f"algorithm.{block}.") for k, _ in listed) == sorted(keys)
        assert all(value and value != "None" for _, value in listed)
    assert "  algorithm.ebpo.cluster_key=null" in out
    text = "\n".join(out)
    assert "ebpo-train --cfg job" in text and "docs/estimator.md" in text and "ppo_trainer:" not in text
