"""The ``why`` study's page (``study.md``), closing note and figure, written from its ``summary.json`` alone
(:func:`ebpo_verl.study.why.summarize`), so a page can be rewritten from a committed summary."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ebpo_verl.study import report
from ebpo_verl.study.report import SIDES

AGAINST_ZERO = dict(zip(SIDES, ("above 0", "below 0", "not separated from 0"), strict=True))


def _bound(r: dict, kind: str = "plain") -> str:
    """``mean ± half`` with its n (seeds, or warm starts for the warm-start family), the one-sided bound for a
    one-sided test."""
    half = r["half"] if kind == "plain" else r["holm_half"]
    n = f"{r['n']} {'warm starts' if r.get('test') == 'warm' else 'seeds'}"
    if r["alternative"] == "greater":
        return f"{r['mean']:+.4f} (one-sided 95% lower bound {r['mean'] - half:+.4f}, {n})"
    return f"{report.pm(r['mean'], half, 4, '+')} ({n})"


def family_lines(recs: list[dict], name: str) -> list[str]:
    """One line per test: what, plain and Holm (over the ``name`` family of ``len(recs)``) intervals, verdicts."""
    lines = []
    for r in recs:
        what = f"{r['a']} - {r['b']}" if r["test"] != "trend" else "slope of accuracy on S"
        lines.append(
            f"- {r['cell']}, {what}: {_bound(r)}, p = {r['p']:.4f}; Holm over the {name} family of {len(recs)}: "
            f"{_bound(r, 'holm')}, adjusted p = {r['p_holm']:.4f}: {AGAINST_ZERO[r['holm']]}."
        )
        if "mde" in r:
            lines[-1] += f" Detectable at 80% power (one-sided 0.025): {r['mde']:.4f}."
    return lines


def dose_table(data: dict, cell: str) -> str:
    """Per arm: its rate, final accuracy (mean ± 95%, seeds) and the stability metrics."""
    final, stab, rates = data["final"][cell]["0"], data["stability"][cell], data["cells"][cell]["rates"]
    head = ["arm", "S", "lr", "final held-out pass@1", "mean S a step", "grad norm (mean, std over steps)",
            "step KL", "final entropy", "zero-signal groups"]  # fmt: skip
    rows = []
    for arm in data["cells"][cell]["arms"]:
        st = stab.get(arm, {})
        rows.append([arm, f"{data['fixed_s'][arm]:g}" if arm in data["fixed_s"] else "—", f"{rates[arm]:g}",
                     report.pm(*report.mean_ci(final.get(arm, {}).values())[:2], 4)
                     + f" ({len(final.get(arm, {}))})",
                     f"{st['shrinkage']:.3f}" if "shrinkage" in st else "—",
                     f"{st.get('grad_norm', math.nan):.3f}, {st.get('grad_norm_std', math.nan):.3f}",
                     f"{st.get('step_kl', math.nan):.2e}", f"{st.get('final_entropy', math.nan):.3f}",
                     f"{st.get('zero_signal', math.nan):.2f}"])  # fmt: skip
    return report.md_table(head, rows)


def page(data: dict) -> str:
    """study.md: the protocol, the dose cells, the three families, the memory and warm-start detail, the
    stratified gains, the closing note."""
    fam = data["families"]
    parts = [
        f"# Why running norms win here ({data['plan']})\n",
        f"Command: `{data['command']}`. Plan, predictions and primary tests: "
        "[study_why_PLAN.md](../study_why_PLAN.md), committed before the first run. Test seeds from "
        f"{min(min(c['seeds_run'] or [0]) for c in data['cells'].values())}, tuning seeds {data['tuning_seeds']}. "
        "Each item below is one Holm family at 95%; intervals are plain and Holm-adjusted t-intervals of paired "
        "differences by seed.\n",
        "## Dose-response (final held-out pass@1 against S)\n",
    ]
    for cell in (c for c in data["cells"] if c.startswith("dose")):
        parts += [f"### {cell}\n", dose_table(data, cell) + "\n"]
    parts += ["### Primary tests: the dose family\n", *family_lines(fam["dose"], "dose"), ""]
    parts += ["## Memory: ebpo - ebpo_batch where history should matter\n", *family_lines(fam["memory"], "memory")]
    parts += [f"- {r['cell']}, ebpo_decay095 - ebpo_batch (not tested): {_bound(r['decay'])}." for r in fam["memory"]]
    parts += ["", "## Warm starts (a random effect)\n", *family_lines(fam["warm"], "warm-start")]
    for r in fam["warm"]:
        per = "; ".join(f"w{w}: {report.pm(p['mean'], p['half'], 4, '+')} ({p['plain']})"
                        for w, p in r["per_warm"].items() if p["n"] > 1)  # fmt: skip
        parts.append(f"- {r['cell']}, ebpo - {r['b']} per warm start (plain 95%): {per or 'no seeds yet'}"
                     + ("; the verdict changes across warm starts." if r["changes"] else "."))  # fmt: skip
    parts += ["", "## Mechanism: gain over grpo on trained prompts, by the warm start's pass rate\n"]
    for cell, arms in data["stratified"].items():
        for arm, by in arms.items():
            below, above = (report.pm(by[k]["mean"], by[k]["half"], 4, "+") for k in ("below", "above"))
            parts.append(f"- {cell}, {arm} - grpo: below 0.05 {below}; at or above {above} ({by['below']['n']} seeds).")
    parts += ["", "Figure: [dose.png](dose.png). Per-prompt data: [per_prompt.npz](per_prompt.npz).\n"]
    return "\n".join(parts) + "\n" + closing_note(data)


def closing_note(data: dict) -> str:
    """The answers issue 52 asks for: the dose curve per cell, best fixed S against running_norm, the memory test
    with its detectable effect, whether a verdict changes across warm starts, the run counts and times."""
    fam, lines = data["families"], ["## Closing note", ""]
    for cell in (c for c in data["cells"] if c.startswith("dose")):
        final = data["final"][cell]["0"]
        curve = ", ".join(f"S={s:g}: {report.pm(*report.mean_ci(final.get(a, {}).values())[:2], 4)}"
                          for a, s in data["fixed_s"].items())  # fmt: skip
        lines.append(f"- {cell}: accuracy against S: {curve}.")
    for r in fam["dose"]:
        if r["test"] == "best_fixed":
            lines.append(f"- {r['cell']}: EBPO at its best fixed S ({r['a']}, chosen on the tuning seeds) is "
                         f"{r['holm']} running_norm (Holm over the dose family): {_bound(r, 'holm')}.")  # fmt: skip
    for r in fam["memory"]:
        lines.append(f"- {r['cell']}: ebpo - ebpo_batch {_bound(r)}; Holm over the memory family: "
                     f"{AGAINST_ZERO[r['holm']]}; "
                     f"detectable at 80% power: {r['mde']:.4f}.")  # fmt: skip
    changes = [f"{r['cell']} ebpo - {r['b']}" for r in fam["warm"] if r["changes"]]
    lines.append("- Across warm starts, a plain verdict changes for: " + (", ".join(changes) or "none") + ".")
    n = data["n_runs"]
    lines += ["", f"Runs: {n['tuning']} tuning, {n['test']} test (cap {n['cap']}). Wall time of the last command: "
              f"{data['wall_seconds']:.0f} s; warm starts and runs summed {data['run_seconds']:.0f} s of their own "
              f"wall time ({data['workers']} processes)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def dose_figure(path: Path, data: dict) -> None:
    """dose.png: per dose cell, final accuracy against S over the fixed-S arms (95% t-intervals), and ebpo (at its
    mean S a step), ebpo_debiased, running_norm and grpo as reference marks."""
    import matplotlib.pyplot as plt

    cells = [c for c in data["cells"] if c.startswith("dose")]
    fig, axes = plt.subplots(1, len(cells), figsize=(4 * len(cells), 3.4), squeeze=False)
    for ax, cell in zip(axes[0], cells, strict=True):
        final, stab = data["final"][cell]["0"], data["stability"][cell]
        stat = np.asarray([report.mean_ci(final.get(a, {}).values())[:2] for a in data["fixed_s"]], dtype=float)
        ax.errorbar(list(data["fixed_s"].values()), stat[:, 0], yerr=np.nan_to_num(stat[:, 1]), fmt="o-", color="0.2",
                    capsize=3, label="fixed S")  # fmt: skip
        for k, arm in enumerate(("ebpo", "ebpo_debiased", "running_norm", "grpo", "ebpo_glob")):
            mean, half, n = report.mean_ci(final.get(arm, {}).values())
            if n == 0:
                continue
            x = stab.get(arm, {}).get("shrinkage", 1.0 if arm in ("running_norm", "ebpo_glob") else 0.0)
            style = report._style(arm, k)
            ax.errorbar([x], [mean], yerr=[np.nan_to_num(half)], fmt=style["marker"], color=style["color"],
                        capsize=3, label=arm)  # fmt: skip
        ax.set_title(cell, fontsize=10)
        ax.set_xlabel("S (mean S a step for ebpo, ebpo_debiased)")
    axes[0][0].set_ylabel("final held-out pass@1")
    axes[0][-1].legend(fontsize=report.LEGEND_PT, loc="upper left", bbox_to_anchor=(1.02, 1))
    report._save(fig, path)
