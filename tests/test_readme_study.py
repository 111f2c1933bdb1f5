"""ebpo_verl.study.readme_tables: the README's CPU-study tables are generated (by the docs command) from the committed
study summary."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ebpo_verl import docs_tables
from ebpo_verl.ops.readme_block import markers
from ebpo_verl.study import readme_tables as rst

ROOT = Path(__file__).resolve().parent.parent

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
    """The README's quick-preset block is exactly what the docs command renders from docs/study_quick.json."""
    summary = json.loads((ROOT / "docs" / "study_quick.json").read_text())
    text = (ROOT / "README.md").read_text()
    begin, end = (f"{m}\n" for m in markers("study-quick"))
    assert text.count(begin) == 1 and text.count(end) == 1
    assert text.split(begin, 1)[1].split(end, 1)[0] == rst.render(summary)
    assert summary["preset"] == "quick" and summary["resumed_runs"] == 0 and summary["n_runs"] == 48  # one invocation


def _checkout(root: Path, readme: str) -> Path:
    """The files the docs command writes, copied under ``root``, with ``readme`` as the README."""
    for rel in [docs_tables.YAML, *docs_tables.pages(docs_tables.DocsOptions(), ROOT), docs_tables.RIVALS2]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text((ROOT / rel).read_text())
    old = (ROOT / "README.md").read_text()
    (root / "README.md").write_text(old.replace("<!-- generated:study-quick:", "<!-- generated:study-x:") + readme)
    return root


HAND_BEGIN, HAND_END = markers("study-hand")


def test_check_and_rewrite(tmp_path, capsys):
    summary = tmp_path / "s.json"
    summary.write_text(json.dumps(HAND))
    readme = _checkout(tmp_path, f"intro\n{HAND_BEGIN}\nold numbers\n{HAND_END}\nrest\n") / "README.md"
    before = readme.read_text()
    args = ["--root", str(tmp_path), "--study", f"hand={summary}"]
    assert docs_tables.main([*args, "--check"]) == 1
    assert "README.md: generated blocks out of date" in capsys.readouterr().err
    assert "old numbers" in readme.read_text()  # --check writes nothing
    assert docs_tables.main(args) == 0
    assert readme.read_text() == before.replace("old numbers\n", HAND_BLOCK)
    assert oct(readme.stat().st_mode & 0o777) == "0o644"
    assert docs_tables.main([*args, "--check"]) == 0


@pytest.mark.parametrize(
    ("readme_text", "summary", "spec", "message"),
    [
        ("no markers\n", HAND, "hand={s}", f"needs exactly one {HAND_BEGIN}"),
        (f"{HAND_BEGIN}\nx\n{HAND_END}\n", None, "hand={s}", "no study summary at"),
        (f"{HAND_BEGIN}\nx\n{HAND_END}\n", "[1]", "hand={s}", "is not a study summary"),
        (f"{HAND_BEGIN}\nx\n{HAND_END}\n", {"preset": "p"}, "hand={s}", "lacks field"),
        (f"{HAND_BEGIN}\nx\n{HAND_END}\n", HAND, "{s}", "use NAME=SUMMARY"),
    ],
)
def test_bad_input_one_line_exit_2(tmp_path, capsys, readme_text, summary, spec, message):
    readme, path = _checkout(tmp_path, readme_text) / "README.md", tmp_path / "s.json"
    before = readme.read_text()
    if summary is not None:
        path.write_text(summary if isinstance(summary, str) else json.dumps(summary))
    with pytest.raises(SystemExit) if spec == "{s}" else _no_exit() as exit_:
        assert docs_tables.main(["--root", str(tmp_path), "--study", spec.format(s=path)]) == 2
    if spec == "{s}":
        assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m ebpo_verl.docs_tables: error: ") and message in err, err
    assert len(err.splitlines()) == 1 and readme.read_text() == before


def _no_exit():
    import contextlib

    return contextlib.nullcontext()


def test_missing_cell_is_named():
    broken = copy.deepcopy(HAND)
    broken["cells"] = broken["cells"][1:]
    with pytest.raises(rst.ReadmeTableError, match=r"no cell \(grpo, G=2, random\)"):
        rst.render(broken)
