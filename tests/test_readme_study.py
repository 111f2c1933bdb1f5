"""scripts/readme_study_tables.py: the README's CPU-study tables are generated from the committed study summary."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import readme_study_tables as rst  # noqa: E402

NEVER = [None, None, 0]
HAND = {  # two estimators at G=2 and 4; numbers chosen so rounding is visible
    "preset": "hand",
    "n_runs": 8,
    "resumed_runs": 0,
    "wall_seconds": 190.4,
    "cpu_seconds": 61.0,
    "torch": "2.13.0+cpu",
    "seeds": 2,
    "steps": 50,
    "responses_per_step": 128,
    "grad_clip": 5.0,
    "target_gain": 0.05,
    "estimators": ["grpo", "ebpo"],
    "group_sizes": [2, 4],
    "warm_start_heldout_accuracy": 0.34784,
    "paired": [
        {"estimator": "ebpo", "baseline": "grpo", "group_size": 2, "diff": [0.01583, 0.0412, 2], "wins": 1},
        {"estimator": "ebpo", "baseline": "grpo", "group_size": 4, "diff": [-0.0021, None, 1], "wins": 0},
    ],
    "warm_start_heldout_pass_at_k": {"1": 0.34784, "8": 0.61234, "64": 0.80449},
    "paired_pass_at_k": {
        "64": [
            {"estimator": "ebpo", "baseline": "grpo", "group_size": 2, "diff": [0.00951, 0.0112, 2], "wins": 2},
            {"estimator": "ebpo", "baseline": "grpo", "group_size": 4, "diff": [None, None, 0], "wins": 0},
        ]
    },
    "cells": [
        {"estimator": e, "group_size": g, "order": "random", "lr": lr, **m}
        for e, g, lr, m in [
            ("grpo", 2, 3e-4, {"final_accuracy": [0.3386, 0.02349, 2], "zero_signal": [0.7912, 0, 2],
                               "grad_norm": [0.5171, 0, 2], "clipped": [0.012, 0, 2], "steps_to_target": [35.0, 5, 2]}),
            ("grpo", 4, 3e-4, {"final_accuracy": [0.3554, None, 1], "zero_signal": [0.5, 0, 2],
                               "grad_norm": [0.968, 0, 2], "clipped": [0.376, 0, 2], "steps_to_target": NEVER}),
            ("ebpo", 2, 1.5e-4, {"final_accuracy": [0.3544, 0.0056, 2], "zero_signal": [0.0, 0, 2],
                                 "grad_norm": [1.3694, 0, 2], "clipped": [0.98, 0, 2],
                                 "steps_to_target": [20.0, None, 1]}),
            ("ebpo", 4, 1.5e-4, {"final_accuracy": [None, None, 0], "zero_signal": [0.0, 0, 2],
                                 "grad_norm": [1.667, 0, 2], "clipped": [0.996, 0, 2], "steps_to_target": NEVER}),
        ]
    ],
}  # fmt: skip

HAND_BLOCK = """Preset `hand`: 8 runs of 50 steps, 3 min 10 s wall time, 1 min 1 s of CPU time
(torch 2.13.0+cpu, one thread per run). Final held-out exact pass@1, mean ± 95% t-interval over
2 seeds (warm start 0.348; each estimator at the learning
rate chosen on the validation split):

| estimator (lr) | G=2 | G=4 |
|---|---|---|
| grpo (0.0003) | 0.339 ± 0.023 | 0.355 |
| ebpo (0.00015) | 0.354 ± 0.006 | n/a |

Paired difference EBPO - X of the final held-out accuracy (same seeds), mean ± 95% t-interval, and the seeds
in which EBPO ends higher:

| EBPO - X | G=2 | G=4 |
|---|---|---|
| grpo | +0.016 ± 0.041 (1/2) | -0.002 (0/1) |

Coverage, EBPO - X in held-out pass@64 (warm start 0.804), G = 2 / 4: grpo +0.010 (2/2) / n/a.

Training signal, mean over steps and seeds, G = 2 / 4: groups with zero advantage grpo 79% / 50%; ebpo 0% / 0%;
updates clipped at norm 5: at most 99.6% in any cell (gradient norms: study.md).
"""


def test_render_hand_example():
    assert rst.render(HAND) == HAND_BLOCK
    resumed = rst.render({**HAND, "resumed_runs": 3, "wall_seconds": 9.0})
    assert resumed.startswith("Preset `hand`: 8 runs of 50 steps, 9 s wall time (the last invocation; 3 runs reused")


def test_readme_matches_committed_quick_summary():
    """The README's quick-preset block is exactly what the script renders from docs/study_quick.json."""
    summary = json.loads((ROOT / "docs" / "study_quick.json").read_text())
    text = (ROOT / "README.md").read_text()
    begin, end = "<!-- study:quick:begin -->\n", "<!-- study:quick:end -->"
    assert text.count(begin) == 1 and text.count(end) == 1
    assert text.split(begin, 1)[1].split(end, 1)[0] == rst.render(summary)
    assert rst.main(["--check"]) == 0
    assert summary["preset"] == "quick" and summary["resumed_runs"] == 0 and summary["n_runs"] == 48  # one invocation


def test_check_and_rewrite(tmp_path, capsys):
    readme = tmp_path / "README.md"
    summary = tmp_path / "s.json"
    summary.write_text(json.dumps(HAND))
    readme.write_text("intro\n<!-- study:hand:begin -->\nold numbers\n<!-- study:hand:end -->\nrest\n")
    spec = f"hand={summary}"
    assert rst.main(["--readme", str(readme), "--check", spec]) == 1
    assert "out of date" in capsys.readouterr().err
    assert "old numbers" in readme.read_text()  # --check writes nothing
    assert rst.main(["--readme", str(readme), spec]) == 0
    assert readme.read_text() == f"intro\n<!-- study:hand:begin -->\n{HAND_BLOCK}<!-- study:hand:end -->\nrest\n"
    assert oct(readme.stat().st_mode & 0o777) == "0o644"
    assert rst.main(["--readme", str(readme), "--check", spec]) == 0


@pytest.mark.parametrize(
    ("readme_text", "summary", "spec", "message"),
    [
        ("no markers\n", HAND, "hand={s}", "needs exactly one <!-- study:hand:begin -->"),
        ("<!-- study:hand:begin -->\nx\n<!-- study:hand:end -->\n", None, "hand={s}", "no study summary at"),
        ("<!-- study:hand:begin -->\nx\n<!-- study:hand:end -->\n", "[1]", "hand={s}", "is not a study summary"),
        ("<!-- study:hand:begin -->\nx\n<!-- study:hand:end -->\n", {"preset": "p"}, "hand={s}", "lacks field"),
        ("<!-- study:hand:begin -->\nx\n<!-- study:hand:end -->\n", HAND, "{s}", "bad spec"),
    ],
)
def test_bad_input_one_line_exit_2(tmp_path, capsys, readme_text, summary, spec, message):
    readme, path = tmp_path / "README.md", tmp_path / "s.json"
    readme.write_text(readme_text)
    if summary is not None:
        path.write_text(summary if isinstance(summary, str) else json.dumps(summary))
    assert rst.main(["--readme", str(readme), spec.format(s=path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("readme_study_tables: error: ") and message in err and len(err.splitlines()) == 1
    assert readme.read_text() == readme_text


def test_missing_cell_is_named():
    broken = copy.deepcopy(HAND)
    broken["cells"] = broken["cells"][1:]
    with pytest.raises(rst.ReadmeTableError, match=r"no cell \(grpo, G=2, random\)"):
        rst.render(broken)
