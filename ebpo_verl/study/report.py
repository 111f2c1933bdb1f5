"""Per-run summaries, cell statistics (mean and 95% t-interval over seeds), markdown tables and PNG figures."""

from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy import stats  # noqa: E402

from ebpo_verl.ops.atomic import atomic_write_text, reporting_full_disk  # noqa: E402
from ebpo_verl.ops.provenance import describe_hardware, provenance, short_commit  # noqa: E402
from ebpo_verl.study.rl import ESTIMATORS  # noqa: E402

CURVES = {  # metric -> (figure file, y label)
    "accuracy": ("learning_curves.png", "held-out exact pass@1"),
    "zero_signal": ("zero_signal.png", "fraction of groups with zero advantage"),
    "grad_norm": ("grad_norm.png", "gradient norm (pre-clip)"),
    "entropy": ("entropy.png", "policy entropy (token mean)"),
    "step_kl": ("kl.png", "per-step KL(old || new), k3"),
}


def summarize_run(run: dict, target: float) -> dict[str, float]:
    """Scalars of one run. ``steps_to_target`` is NaN when the held-out accuracy never reaches ``target``."""
    m, cfg = run["metrics"], run["config"]
    acc, steps = np.asarray(m["accuracy"]), np.asarray(m["eval_step"])
    reached = np.flatnonzero(acc >= target)
    to_target = float(steps[reached[0]]) if len(reached) else math.nan
    return {
        "final_accuracy": float(acc[-1]),
        "gain": float(acc[-1] - acc[0]),
        "probe_final_accuracy": float(m["probe_accuracy"][-1]) if m["probe_accuracy"] else math.nan,
        "steps_to_target": to_target,
        "responses_to_target": to_target * cfg["responses_per_step"],
        "zero_signal": float(np.mean(m["zero_signal"])),
        "uniform_groups": float(np.mean(m["uniform_groups"])),
        "grad_norm": float(np.mean(m["grad_norm"])),
        "clipped": float(np.mean(m["clipped"])),
        "entropy_final": float(np.mean(m["entropy"][-5:])),
        "step_kl": float(np.mean(m["step_kl"])),
        "kl_ref_final": float(m["kl_ref"][-1]),
        "shrinkage": float(np.mean(m["shrinkage"])) if m["shrinkage"] else math.nan,
        "train_seen_gain": float(m["train_seen_gain"][0]),
        "train_unseen_gain": float(m["train_unseen_gain"][0]),
        "train_seen_fraction": float(m["train_seen_fraction"][0]),
        **{k: float(np.mean(m[k])) for k in ("spo_frac_seen", "dbb_frac_seen") if k in m},
    }


def mean_ci(values) -> tuple[float, float, int]:
    """Mean, half-width of the two-sided 95% t-interval, and n of the finite values (NaN when n < 2)."""
    x = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if len(x) == 0:
        return math.nan, math.nan, 0
    if len(x) == 1:
        return float(x[0]), math.nan, 1
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), float(half), len(x)


def cells(runs: list[dict], target: float) -> dict[tuple, list[dict[str, float]]]:
    """Run summaries grouped by (estimator, group_size, order)."""
    out: dict[tuple, list] = defaultdict(list)
    for run in runs:
        c = run["config"]
        out[(c["estimator"], c["group_size"], c["order"])].append(summarize_run(run, target))
    return out


def _fmt(values, digits: int = 3, total: int | None = None) -> str:
    mean, half, n = mean_ci(values)
    if n == 0:
        return f"never (0/{total})" if total else "n/a"
    text = f"{mean:.{digits}f}" + (f" ± {half:.{digits}f}" if np.isfinite(half) else "")
    return text + (f" ({n}/{total})" if total is not None and n < total else "")


def table(
    by_cell: dict, rows: list[str], cols: list, key, metric: str, col_name: str, digits: int = 3, censored=False
) -> str:
    """Markdown table, rows = estimators, one column per ``cols`` value; ``key(row, col)`` finds the cell."""
    head = "| estimator | " + " | ".join(f"{col_name}={c}" for c in cols) + " |"
    lines = [head, "|---" * (len(cols) + 1) + "|"]
    for r in rows:
        vals = []
        for c in cols:
            runs = by_cell.get(key(r, c), [])
            total = len(runs) if censored else None
            vals.append(_fmt([s[metric] for s in runs], digits, total) if runs else "—")
        lines.append(f"| {r} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def dynamics_table(by_cell: dict, rows: list[str], g: int, order: str = "random") -> str:
    cols = [
        ("zero_signal", "zero-signal groups"),
        ("grad_norm", "grad norm (pre-clip)"),
        ("clipped", "updates clipped"),
        ("entropy_final", "final entropy"),
        ("step_kl", "per-step KL"),
        ("kl_ref_final", "KL to warm start"),
        ("shrinkage", "mean S"),
    ]
    lines = ["| estimator | " + " | ".join(n for _, n in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for r in rows:
        runs = by_cell.get((r, g, order), [])
        lines.append(f"| {r} | " + " | ".join(_fmt([s[k] for s in runs], 4) for k, _ in cols) + " |")
    return "\n".join(lines)


def _curve_stats(runs: list[dict], metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ys = np.asarray([r["metrics"][metric] for r in runs], dtype=float)
    xs = np.asarray(runs[0]["metrics"]["eval_step"]) if metric == "accuracy" else np.arange(1, ys.shape[1] + 1)
    mean = ys.mean(axis=0)
    half = stats.t.ppf(0.975, len(ys) - 1) * ys.std(axis=0, ddof=1) / math.sqrt(len(ys)) if len(ys) > 1 else 0 * mean
    return xs, mean, half


def _save(fig, path: Path) -> None:
    tmp = path.with_name(path.stem + ".tmp.png")
    with reporting_full_disk(path):
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
        plt.close(fig)
        os.replace(tmp, path)


STYLES = {  # estimator -> (colour, marker, line style); colour-blind-safe (Okabe-Ito) for the quick preset's five
    "grpo": ("#0072B2", "o", "-"),
    "grpo_bn": ("#E69F00", "s", "--"),
    "ebpo": ("#000000", "^", "-"),
    "ebpo_batch": ("#009E73", "v", (0, (5, 2, 1, 2))),
    "otb": ("#CC79A7", "D", "-."),
    "rloo": ("#56B4E9", "P", ":"),
    "reinforce_pp": ("#E377C2", "X", "--"),
    "ebpo_bb": ("#7F7F7F", "*", "-."),
    "ebpo_topic": ("#8C564B", "h", ":"),
    "shrinkage_js": ("#BCBD22", "<", "--"),
    "bnpo": ("#17BECF", ">", "-."),
    "spo": ("#9467BD", "p", ":"),
    "dbb": ("#D55E00", "d", (0, (3, 1, 1, 1))),
}
LEGEND_PT = 9
FRACTIONS = {"zero_signal"}  # metrics in [0, 1]


def _style(est: str, k: int) -> dict:
    """A fixed colour, marker and line style per estimator (ebpo and ebpo_batch differ in all three; ebpo_batch's
    markers are hollow), and a width and drawing order per position ``k``, so lines that coincide (EBPO's
    zero-signal fraction is 0 in both variants) stay visible: earlier lines are wider and drawn below."""
    color, marker, ls = STYLES[est]
    return {
        "color": color,
        "ls": ls,
        "marker": marker,
        "mfc": "white" if est == "ebpo_batch" else color,
        "lw": max(2.4 - 0.35 * k, 1.2),
        "ms": 5,
        "zorder": 3 + k,
    }


def curve_figure(
    runs: list[dict],
    metric: str,
    groups: list,
    estimators: list[str],
    path: Path,
    by: str,
    fixed: dict,
    hline: tuple[float, str] | None = None,
    source: str = "",
) -> None:
    """One panel per ``groups`` value of config key ``by`` (G or order), one line per estimator (mean over seeds)
    with 95% t-interval error bars at its markers, the estimators' bars shifted apart along x so that they do
    not merge, among the runs whose config matches ``fixed`` (e.g. the order, or G). ``hline`` = (y, label)
    draws a reference line; ``source`` (the preset and provenance) is printed under the figure."""
    fig, axes = plt.subplots(1, len(groups), figsize=(3.8 * len(groups), 3.4), sharey=True, squeeze=False)
    seeds = set()
    for ax, grp in zip(axes[0], groups, strict=True):
        if hline is not None:
            ax.axhline(hline[0], color="0.45", lw=1, ls=(0, (1, 1)), label=hline[1], zorder=1)
        for k, est in enumerate(estimators):
            want = {"estimator": est, by: grp, **fixed}
            sel = [r for r in runs if all(r["config"][key] == v for key, v in want.items())]
            if not sel:
                continue
            seeds.add(len(sel))
            xs, mean, half = _curve_stats(sel, metric)
            style = _style(est, k)
            every = max(1, len(xs) // 6)
            at = np.arange(k % every, len(xs), every)
            ax.plot(xs, mean, label=est, markevery=list(at), **style)
            dodge = (k - (len(estimators) - 1) / 2) * 0.012 * (xs[-1] - xs[0])
            low = np.minimum(half, mean)[at]  # every plotted quantity is >= 0: bars stop at 0 (and a fraction at 1)
            high = np.minimum(half, 1.0 - mean)[at] if metric in FRACTIONS else half[at]
            ax.errorbar(
                xs[at] + dodge,
                mean[at],
                yerr=[low, high],
                fmt="none",
                ecolor=style["color"],
                elinewidth=1.1,
                capsize=2.5,
                zorder=style["zorder"],
            )
        ax.set_title(f"{'G' if by == 'group_size' else 'order'} = {grp}", fontsize=10)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    low, top = axes[0][0].get_ylim()  # shared y; every quantity is >= 0: a line at 0 must not sit on the spine
    if -0.03 * (top - low) < low <= 0:
        axes[0][0].set_ylim(-0.04 * top, top)
    axes[0][0].set_ylabel(CURVES[metric][1])
    axes[0][-1].legend(fontsize=LEGEND_PT, loc="upper left", bbox_to_anchor=(1.02, 1))
    n = "/".join(str(x) for x in sorted(seeds))
    note = f"Lines: mean over {n} seeds; error bars: 95% t-intervals over seeds (shifted apart along x)."
    fig.text(0.5, -0.02, note + (f"\n{source}" if source else ""), ha="center", va="top", fontsize=8.5)
    _save(fig, path)


def paired(runs: list[dict], estimators: list[str], group_sizes: list[int], reference: str = "ebpo") -> list[dict]:
    """Per G (random order) and every other estimator X: the per-seed differences ``reference - X`` of the final
    held-out accuracy (runs of the same seed share the warm start, the data stream and the sampling seed), as
    [mean, 95% t half-width, n] over the seeds both ran, and ``wins``: the seeds where ``reference`` is higher."""
    final = {
        (c["estimator"], c["group_size"], c["seed"]): r["metrics"]["accuracy"][-1]
        for r in runs
        if (c := r["config"])["order"] == "random"
    }
    out = []
    if reference not in estimators:
        return out
    for g in group_sizes:
        for x in estimators:
            if x == reference:
                continue
            seeds = sorted(s for (e, gg, s) in final if e == reference and gg == g and (x, g, s) in final)
            diff = [final[reference, g, s] - final[x, g, s] for s in seeds]
            mean, half, n = mean_ci(diff)
            out.append({
                "estimator": reference,
                "baseline": x,
                "group_size": g,
                "diff": [None if not np.isfinite(v) else round(v, 6) for v in (mean, half)] + [n],
                "wins": int(sum(d > 0 for d in diff)),
            })  # fmt: skip
    return out


def paired_table(pairs: list[dict], group_sizes: list[int]) -> str:
    """Markdown: rows = baseline X, columns = G, cells ``mean ± half-width (wins/n)`` of EBPO - X."""
    xs = list(dict.fromkeys(p["baseline"] for p in pairs))
    if not xs:
        return "(no pairs: the reference estimator is not in this preset)"
    at = {(p["baseline"], p["group_size"]): p for p in pairs}
    lines = ["| EBPO - X | " + " | ".join(f"G={g}" for g in group_sizes) + " |", "|---" * (len(group_sizes) + 1) + "|"]
    for x in xs:
        cells = []
        for g in group_sizes:
            p = at.get((x, g))
            if p is None or p["diff"][2] == 0:
                cells.append("—")
                continue
            mean, half, n = p["diff"]
            cells.append(f"{mean:+.3f}" + (f" ± {half:.3f}" if half is not None else "") + f" ({p['wins']}/{n})")
        lines.append(f"| {x} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_verdict(pairs: list[dict]) -> str:
    """One sentence per G: where EBPO - X's 95% interval lies above 0, below 0, or covers it."""
    by_g: dict[int, list[str]] = defaultdict(list)
    for p in pairs:
        mean, half, n = p["diff"]
        if n < 2 or half is None:
            continue
        side = "ahead of" if mean - half > 0 else "behind" if mean + half < 0 else "not separated from"
        by_g[p["group_size"]].append(f"{side} {p['baseline']} ({mean:+.3f} ± {half:.3f}, wins {p['wins']}/{n})")
    return " ".join(f"G={g}: EBPO is {'; '.join(v)}." for g, v in sorted(by_g.items()))


def _mean(by_cell: dict, cell: tuple, metric: str) -> float:
    return mean_ci([s[metric] for s in by_cell.get(cell, [])])[0]


def study_provenance(preset, seconds: float, command: str) -> dict:
    """The provenance record of a study (:mod:`ebpo_verl.ops.provenance`): its seeds are the runs' seeds 0..n-1 and
    the warm start's seed 0; ``started`` is ``seconds`` before now."""
    from ebpo_verl.study.presets import BASE_SEED

    seed = {"runs": list(range(preset.seeds)), "warm_start": BASE_SEED}
    return provenance(seed=seed, command=command, started=time.time() - seconds)


def source_line(preset_name: str, record: dict) -> str:
    """One line naming the preset and what produced the numbers, for under a table or a figure."""
    return (
        f"preset {preset_name}; ebpo-verl commit {short_commit(record)}; {describe_hardware(record)}; "
        f"torch {record.get('torch')}, verl {record.get('verl')}; started {record.get('started')}"
    )


def _with_source_lines(text: str, line: str) -> str:
    """``text`` with ``line`` (in italics) after every markdown table."""
    out, lines = [], text.split("\n")
    for i, ln in enumerate(lines):
        out.append(ln)
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if ln.startswith("|") and not nxt.startswith("|"):
            out += ["", f"*Source: {line}.*"]
    return "\n".join(out)


def summary(
    preset,
    base_info: dict,
    runs: list[dict],
    seconds: float,
    command: str,
    resumed: int,
    record: dict | None = None,
    lr_grid: dict | None = None,
    tuning_runs: int = 0,
) -> dict:
    """The study's machine-readable summary (``summary.json``): what ran, its provenance, mean / 95%
    half-width / n over seeds of every per-run scalar in every cell (NaN as null) with the cell's ``lr``, the
    learning-rate grid (``lr_grid``: per estimator the rates tried, their validation scores, the choice and its
    source) and the paired differences (``paired``, :func:`paired`). ``scripts/readme_study_tables.py`` reads it."""
    target = base_info["heldout_accuracy"] + preset.target_gain
    by_cell = cells(runs, target)

    def stat(values):
        return [None if not np.isfinite(x) else round(x, 6) for x in mean_ci(values)[:2]] + [mean_ci(values)[2]]

    lrs = {(r["config"]["estimator"], r["config"]["group_size"], r["config"]["order"]): r["config"]["lr"] for r in runs}
    return {
        "preset": preset.name,
        "command": command,
        "n_runs": len(runs),
        "tuning_runs": tuning_runs,
        "resumed_runs": resumed,
        "wall_seconds": round(seconds, 1),
        "cpu_seconds": round(base_info["sft_cpu_seconds"] + sum(r["cpu_seconds"] for r in runs), 1),
        "torch": torch.__version__,
        "torch_threads_per_run": 1,
        "seeds": preset.seeds,
        "steps": preset.rl["steps"],
        "responses_per_step": preset.rl["responses_per_step"],
        "grad_clip": preset.rl["grad_clip"],
        "estimators": list(preset.estimators),
        "group_sizes": list(preset.group_sizes),
        "warm_start_heldout_accuracy": round(base_info["heldout_accuracy"], 6),
        "target_gain": preset.target_gain,
        "provenance": record if record is not None else study_provenance(preset, seconds, command),
        "lr_grid": lr_grid or {},
        "paired": paired(runs, list(preset.estimators), list(preset.group_sizes)),
        "cells": [
            {
                "estimator": e,
                "group_size": g,
                "order": o,
                "lr": lrs[e, g, o],
                **{k: stat([s[k] for s in sums]) for k in sums[0]},
            }
            for (e, g, o), sums in sorted(by_cell.items())
        ],
    }


def write_report(
    out: Path,
    preset,
    base_info: dict,
    runs: list[dict],
    seconds: float,
    command: str,
    resumed: int = 0,
    lr_grid: dict | None = None,
    tuning_runs: int = 0,
) -> str:
    """Write ``study.md``, ``summary.json`` and the figures into ``out``; returns the headline table (final
    held-out accuracy)."""
    ws = base_info["heldout_accuracy"]
    target = ws + preset.target_gain
    by_cell = cells(runs, target)
    record = study_provenance(preset, seconds, command)
    source = source_line(preset.name, record)
    ests, gs = list(preset.estimators), list(preset.group_sizes)
    pairs = paired(runs, ests, gs)
    lr_text = ", ".join(f"{e} {runs_lr(runs, e):g}" for e in ests)
    orders, o_ests, og = list(preset.orders), list(preset.order_estimators), preset.order_group_size
    main = lambda r, c: (r, c, "random")  # noqa: E731
    headline = table(by_cell, ests, gs, main, "final_accuracy", "G")
    clip = runs[0]["config"]["grad_clip"]
    warm = (ws, f"warm start {ws:.3f}")
    lines = {"accuracy": warm, "grad_norm": (clip, f"clip = {clip:g}")}
    for metric, (fname, _) in CURVES.items():
        curve_figure(
            runs,
            metric,
            gs,
            ests,
            out / fname,
            by="group_size",
            fixed={"order": "random"},
            hline=lines.get(metric),
            source=source,
        )
    curve_figure(
        runs,
        "accuracy",
        orders,
        o_ests,
        out / "ordering_curves.png",
        by="order",
        fixed={"group_size": og},
        hline=warm,
        source=source,
    )
    captions = {
        "learning_curves.png": "held-out exact pass@1 over RL steps, one panel per G; dotted: the warm start",
        "zero_signal.png": "fraction of groups whose advantages are all zero, per step",
        "grad_norm.png": f"gradient norm before clipping, per step; dotted: the clip value {clip:g} (a norm above "
        "it is scaled down to it)",
        "entropy.png": "token-mean policy entropy of the sampled responses, per step",
        "kl.png": "k3 estimate of KL(old || new) over one step's update",
        "ordering_curves.png": f"held-out exact pass@1 at G={og} by stream order; dotted: the warm start",
    }
    rl = preset.rl
    order_section = (
        f"## Stream order (G = {og}): final held-out accuracy\n\n"
        f"{table(by_cell, o_ests, orders, lambda r, c: (r, og, c), 'final_accuracy', 'order')}\n"
        if o_ests
        else ""
    )
    hist = base_info["pass_rate_histogram"]
    left_out = [e for e in ESTIMATORS if e not in ests]
    scope = (
        f"Estimators: {', '.join(ests)}; G in {gs}; orders {orders} (ordering table at G={og} for {', '.join(o_ests)})."
    )
    if left_out:
        scope += f" Not in this preset (run `--preset full`): {', '.join(left_out)}."
    cpu = base_info["sft_cpu_seconds"] + sum(r["cpu_seconds"] for r in runs)
    resumed_note = f" ({resumed} of them reused from an earlier invocation of the same command)" if resumed else ""
    text = f"""# EBPO small-scale RLVR study (preset `{preset.name}`)

Command: `{command}` — {len(runs)} RL runs{resumed_note}, {seconds:.0f} s wall time on this machine
({cpu:.0f} CPU-seconds for the warm start and the runs). {scope}

## Setup
- Policy: a {base_info["params"]:,}-parameter causal transformer ({preset.policy.n_layer} layers,
  d={preset.policy.d_model}) that writes its answer token by token (least-significant digit first, then EOS).
- Tasks: topics {", ".join(preset.topics)} x levels {", ".join(map(str, preset.levels))} (operand digits); reward 1
  iff the answer is exactly right. Four disjoint iid draws from the same generator, the same number per
  (topic, level) cell: {base_info["n_train"]} RL training prompts, {base_info["n_heldout"]} held-out test prompts
  (every accuracy below), {base_info["n_val"]} validation prompts (the learning-rate choice only) and the
  warm-start data.
- Warm start: {preset.sft_steps} supervised steps on a separate split in which a fraction {preset.misconception} of the
  answers follow a carry-free misconception, so the base model holds a right and a wrong strategy.
  Held-out exact pass@1 of the warm start: {ws:.3f}; pass rates on the RL prompts
  (histogram over ten bins 0..1): {hist}; {100 * base_info["frac_train_below_0.05"]:.0f}% of them below 0.05.
- RL: {rl["steps"]} steps of {rl["responses_per_step"]} sampled responses (temperature 1), so a step holds
  {rl["responses_per_step"]}/G prompts (equal samples per step at every G); PPO-clip 0.2 with token-mean aggregation
  (`compute_policy_loss_vanilla`), k3 KL loss to the warm start (coefficient 0.001), two mini-batches per step,
  AdamW at each estimator's own learning rate ({lr_text}), gradient clip {clip:g} (a safety net: see the share of
  clipped updates below). Advantages from verl's registry (`get_adv_estimator_fn`).
- Accuracy = exact pass@1 at temperature 1 (the product of the answer tokens' probabilities), averaged over
  the held-out prompts: no sampling noise in the evaluation. Every cell: seeds 0..{preset.seeds - 1} (the same seeds
  for every estimator); mean ± half-width of the 95% t-interval over seeds.
- Reproducibility: every run uses one torch thread and seeded generators, so rerunning the command on the same
  machine and torch build gives the same numbers; another CPU (other vector kernels) or torch build can change
  them in the third decimal.

## Final held-out accuracy (rows = estimator, columns = G; random order)
Warm start: {ws:.3f}.

{headline}

## Paired differences: EBPO - X in final held-out accuracy
Per G, the difference between EBPO's run and X's run of the same seed (same warm start, data stream and sampling
seed), mean ± 95% t-interval over the seeds, and in brackets the seeds in which EBPO ends higher.

{paired_table(pairs, gs)}

{paired_verdict(pairs)}

## Learning rates
{lr_section(lr_grid or {})}

## Steps to reach held-out accuracy {target:.3f} (warm start + {preset.target_gain})
Mean over the seeds that reached it (count in brackets when not all did);
sampled responses = steps x {rl["responses_per_step"]}.

{table(by_cell, ests, gs, main, "steps_to_target", "G", 1, censored=True)}

## Fraction of groups with zero advantage signal (mean over training)

{table(by_cell, ests, gs, main, "zero_signal", "G")}

## Final accuracy on a fixed sample of the RL training prompts
Warm start: {base_info["probe_accuracy"]:.3f}. These prompts belong to the RL stream, so a run may have trained on them.

{table(by_cell, ests, gs, main, "probe_final_accuracy", "G")}

{_below_warm_start(by_cell, ests, gs, ws, rl)}
{spo_note(by_cell, ests, gs)}
{order_section}
## Training dynamics at G = {og} (random order)

{dynamics_table(by_cell, ests, og)}

{_gradient_note(by_cell, ests, gs, og, clip)}

## Figures
Lines are means over the {preset.seeds} seeds; error bars are 95% t-intervals over seeds (stopped at 0), shifted
apart along x so that the estimators' intervals stay distinguishable; each figure names its preset and provenance.

{chr(10).join(f"- [{f}]({f}): {c}" for f, c in captions.items())}

## What this toy does and does not show
- It runs the real code paths: verl's advantage registry (GRPO, RLOO, REINFORCE++-baseline and the package's
  `ebpo`), verl's PPO-clip loss, `agg_loss` and `kl_penalty`, on sampled token-by-token answers with verifiable
  rewards, so group statistics, zero-signal groups, shrinkage and the stream order behave as in training.
- It is not LLM-scale evidence: a ~10^5-parameter model, {rl["steps"]} steps, one warm start, arithmetic only.
  What RL learns here is a rule shared by the prompts (carrying, which the warm start mostly skips), so it
  transfers to held-out prompts; read the tables as "what the estimators do to sample efficiency at small
  scale", not as a replication of the paper's benchmark numbers.
- The difficulty order ends on the hardest prompts, so its final accuracy measures the end of a curriculum,
  not its average.
"""
    text = _with_source_lines(text, source)
    atomic_write_text(out / "study.md", text)
    atomic_write_text(
        out / "summary.json",
        json.dumps(summary(preset, base_info, runs, seconds, command, resumed, record, lr_grid, tuning_runs), indent=1)
        + "\n",
    )
    return headline


def runs_lr(runs: list[dict], estimator: str) -> float:
    """The learning rate of ``estimator``'s runs (one per estimator)."""
    return next(r["config"]["lr"] for r in runs if r["config"]["estimator"] == estimator)


def lr_section(lr_grid: dict) -> str:
    """The learning-rate grid: per estimator the rates tried, the validation score of each, the choice."""
    if not lr_grid:
        return "Fixed learning rates (no grid recorded for this preset)."
    lines = ["| estimator | rates tried: mean validation accuracy over the run | chosen |", "|---|---|---|"]
    for e, g in lr_grid.items():
        scores = ", ".join(
            f"{v:g}: " + ("n/a" if s[0] is None else f"{s[0]:.3f}" + (f" ± {s[1]:.3f}" if s[1] is not None else ""))
            for v, s in zip(g["values"], g["validation"], strict=True)
        )
        lines.append(f"| {e} | {scores} | {g['chosen']:g} |")
    sources = sorted({g.get("source", "") for g in lr_grid.values()})
    return "\n".join(lines) + "\n\nWhere the rates come from (never from the test split): " + "; ".join(sources) + "."


def _below_warm_start(by_cell: dict, ests: list[str], gs: list[int], ws: float, rl: dict) -> str:
    """Where the final model gained, for the G at which every estimator ends below the warm start."""
    below = [g for g in gs if all(_mean(by_cell, (e, g, "random"), "final_accuracy") < ws for e in ests)]
    if not below:
        return ""

    def cell(e: str, g: int) -> str:
        parts = [_mean(by_cell, (e, g, "random"), k) for k in ("train_seen_gain", "train_unseen_gain")]
        held = _mean(by_cell, (e, g, "random"), "final_accuracy") - ws
        return " / ".join("n/a" if not np.isfinite(x) else f"{x:+.3f}" for x in (*parts, held))

    seen = {g: _mean(by_cell, (ests[0], g, "random"), "train_seen_fraction") for g in gs}
    head = "| estimator | " + " | ".join(f"G={g}" for g in gs) + " |"
    rows = [f"| {e} | " + " | ".join(cell(e, g) for g in gs) + " |" for e in ests]
    return f"""## Why every estimator ends below the warm start at G = {", ".join(map(str, below))}
Change of exact pass@1 from the warm start to the final model, mean over seeds: on the RL prompts the run
trained on / on the RL prompts it never saw / on the held-out prompts.

{head}
{"|---" * (len(gs) + 1)}|
{chr(10).join(rows)}

A step holds {rl["responses_per_step"]}/G prompts, so in {rl["steps"]} steps a run sees
{", ".join(f"{100 * seen[g]:.0f}% (G={g})" for g in gs)} of the RL prompts. What the runs show: they raise the
accuracy of the prompts they trained on at every G, and change little or lose on the RL prompts they never saw;
at large G they see few prompts, so their held-out change follows the unseen prompts, not the trained ones. The
held-out set also weighs the 1-digit cells, which the RL stream rarely visits, more than the stream does (see
Setup). The pattern appears for every estimator, so it is a property of a tiny model that transfers little
between prompts, not a difference between the estimators.
"""


def spo_note(by_cell: dict, ests: list[str], gs: list[int]) -> str:
    """How often SPO's tracker had seen a step's prompts before: where never, its baseline stays 0.5."""
    if "spo" not in ests:
        return ""
    seen = {
        g: mean_ci([s.get("spo_frac_seen", math.nan) for s in by_cell.get(("spo", g, "random"), [])])[0] for g in gs
    }
    never = [g for g in gs if seen[g] == 0.0]
    text = (
        "## SPO's tracker: how often a prompt recurs\nShare of a step's prompts that the tracker had seen at an "
        "earlier step (mean over steps and seeds): "
        + ", ".join(f"G={g} {'n/a' if not np.isfinite(seen[g]) else f'{100 * seen[g]:.0f}%'}" for g in gs)
        + ". SPO's baseline for a prompt it has not seen is 0.5, so where this share is low the spo row is close to "
        "A = r - 0.5 with batch standardisation, not SPO's tracker."
    )
    if never:
        text += (
            f" At G = {', '.join(map(str, never))} a run covers less than one epoch of the RL prompts, so no prompt "
            "recurs and EVERY SPO baseline stays 0.5 (the authors' fork's uid-keyed tracker in another form): these "
            "spo cells do not measure SPO."
        )
    return text + "\n"


def _gradient_note(by_cell: dict, ests: list[str], gs: list[int], og: int, clip: float) -> str:
    """How often updates were clipped, and where GRPO+BN's gradient norm is above EBPO's."""
    clipped = ", ".join(f"{e} {100 * _mean(by_cell, (e, og, 'random'), 'clipped'):.0f}%" for e in ests)
    text = (
        f"Share of mini-batch updates whose pre-clip gradient norm exceeded the clip value {clip:g} at G={og}: "
        f"{clipped}. A clipped update is scaled down to norm {clip:g}, so a higher pre-clip gradient norm "
        "overstates the size of the applied update."
    )
    if {"grpo", "grpo_bn", "ebpo"} <= set(ests):
        norm = {(e, g): _mean(by_cell, (e, g, "random"), "grad_norm") for e in ("grpo", "grpo_bn", "ebpo") for g in gs}
        higher = [g for g in gs if norm["grpo_bn", g] > norm["ebpo", g] > norm["grpo", g]]
        if higher:
            text += (
                f" At G = {', '.join(map(str, higher))} the mean pre-clip norm of GRPO+BN is higher than EBPO's, and "
                "EBPO's higher than GRPO's. GRPO+BN differs from GRPO only in standardising the advantages over the "
                "batch instead of per group, and from EBPO only in having no shrinkage, so in this toy the higher "
                "norm comes with the batch standardisation, not with the shrinkage."
            )
    return text
