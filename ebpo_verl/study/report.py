"""Per-run summaries, cell statistics (mean and 95% t-interval over seeds), paired differences, markdown tables and
PNG figures; the report (its text and summary.json) is :mod:`ebpo_verl.study.writeup`."""

from __future__ import annotations

import math
import re
import time
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from ebpo_verl.ops.atomic import atomic_write  # noqa: E402
from ebpo_verl.ops.provenance import describe_hardware, provenance, short_commit  # noqa: E402

CURVES = {  # metric -> (figure file, y label, caption in the report's list of figures; {clip}: the gradient clip)
    "accuracy": ("learning_curves.png", "held-out exact pass@1",
                 "held-out exact pass@1 over RL steps, one panel per G; dotted: the warm start"),
    "zero_signal": ("zero_signal.png", "fraction of groups with zero advantage",
                    "fraction of groups whose advantages are all zero, per step"),
    "grad_norm": ("grad_norm.png", "gradient norm (pre-clip)", "gradient norm before clipping, per step; dotted: the "
                  "clip value {clip:g} (a norm above it is scaled down to it)"),
    "entropy": ("entropy.png", "policy entropy (token mean)",
                "token-mean policy entropy of the sampled responses, per step"),
    "step_kl": ("kl.png", "per-step KL(old || new), k3", "k3 estimate of KL(old || new) over one step's update"),
}  # fmt: skip


COVERAGE_K = (1, 8, 64)
"""The k of the held-out pass@k every cell reports (pass@1 is ``final_accuracy``)."""


def pass_at_k(p, k: int) -> float:
    """Mean over prompts of 1 - (1 - p)^k from exact success probabilities ``p`` (float64); NaN for no prompts."""
    p = np.asarray(p, dtype=np.float64)
    return float(np.mean(1.0 - (1.0 - p) ** k)) if p.size else math.nan


def run_pass_at_k(run: dict, k: int) -> float:
    """Final held-out pass@k of one run: ``final_accuracy`` at k = 1, else :func:`pass_at_k` of ``heldout_pass_final``
    (NaN without them)."""
    m = run["metrics"]
    if k == 1:
        return float(m["accuracy"][-1])
    return pass_at_k(m["heldout_pass_final"], k) if len(m.get("heldout_pass_final", ())) else math.nan


def summarize_run(run: dict, target: float) -> dict[str, float]:
    """Scalars of one run (``steps_to_target``: NaN if ``target`` is never reached; ``pass_at_<k>``: final pass@k)."""
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
        **{k: float(np.mean(m[k])) for k in ("zero_signal", "uniform_groups", "grad_norm", "clipped")},
        "entropy_final": float(np.mean(m["entropy"][-5:])),
        "step_kl": float(np.mean(m["step_kl"])),
        "kl_ref_final": float(m["kl_ref"][-1]),
        "shrinkage": float(np.mean(m["shrinkage"])) if m["shrinkage"] else math.nan,
        **{k: float(m[k][0]) for k in ("train_seen_gain", "train_unseen_gain", "train_seen_fraction")},
        **{k: float(np.mean(v)) for k, v in m.items() if k.endswith("_frac_seen")},
        **{f"pass_at_{k}": run_pass_at_k(run, k) for k in COVERAGE_K if k > 1},
    }


def mean_ci(values) -> tuple[float, float, int]:
    """Mean, half-width of the two-sided 95% t-interval, and n of the finite values (NaN when n < 2)."""
    x = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if len(x) == 0:
        return math.nan, math.nan, 0
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)) if len(x) > 1 else math.nan
    return float(x.mean()), float(half), len(x)


def ci_record(values) -> list:
    """:func:`mean_ci` as the JSON files hold it: [mean, half-width, n], rounded to 6 decimals, None where NaN."""
    mean, half, n = mean_ci(values)
    return [None if not np.isfinite(v) else round(v, 6) for v in (mean, half)] + [n]


def cells(runs: list[dict], target: float) -> dict[tuple, list[dict[str, float]]]:
    """Run summaries grouped by (estimator, group_size, order)."""
    out: dict[tuple, list] = defaultdict(list)
    for run in runs:
        c = run["config"]
        out[(c["estimator"], c["group_size"], c["order"])].append(summarize_run(run, target))
    return out


def md_table(head: list[str], rows: list[list[str]]) -> str:
    """A markdown table: the ``head`` cells, the separator row, then each row's cells."""
    lines = ["| " + " | ".join(cells) + " |" for cells in [head, *rows]]
    lines.insert(1, "|---" * len(head) + "|")
    return "\n".join(lines)


def pm(mean: float, half: float | None, digits: int = 3, sign: str = "") -> str:
    """``mean ± half`` (``sign`` "+": the mean signed); the half-width left out where None or NaN."""
    return f"{mean:{sign}.{digits}f}" + (f" ± {half:.{digits}f}" if half is not None and np.isfinite(half) else "")


def _fmt(values, digits: int = 3, total: int | None = None) -> str:
    mean, half, n = mean_ci(values)
    if n == 0:
        return f"never (0/{total})" if total else "n/a"
    return pm(mean, half, digits) + (f" ({n}/{total})" if total is not None and n < total else "")


def table(
    by_cell: dict,
    rows: list[str],
    cols: list,
    metric: str,
    col_name: str,
    digits: int = 3,
    censored=False,
    seeds: int | None = None,
    key=None,
) -> str:
    """Markdown table, rows = estimators, columns = ``cols`` (``key(row, col)`` finds the cell; default the random-order
    cell of G = col); a cell over fewer finite values than its runs or ``seeds`` shows ``(n/total)``."""

    def cell(runs: list[dict]) -> str:
        return _fmt([s[metric] for s in runs], digits, len(runs) if censored else seeds) if runs else "—"

    body = [[r, *(cell(by_cell.get(key(r, c) if key else (r, c, "random"), [])) for c in cols)] for r in rows]
    return md_table(["estimator", *(f"{col_name}={c}" for c in cols)], body)


DYNAMICS = {"zero_signal": "zero-signal groups", "grad_norm": "grad norm (pre-clip)", "clipped": "updates clipped",
            "entropy_final": "final entropy", "step_kl": "per-step KL", "kl_ref_final": "KL to warm start",
            "shrinkage": "mean S"}  # fmt: skip
"""The training-dynamics table's columns: run summary -> heading."""


def dynamics_table(by_cell: dict, rows: list[str], g: int, order: str = "random") -> str:
    body = [[r, *(_fmt([s[k] for s in by_cell.get((r, g, order), [])], 4) for k in DYNAMICS)] for r in rows]
    return md_table(["estimator", *DYNAMICS.values()], body)


def _curve_stats(runs: list[dict], metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ys = np.asarray([r["metrics"][metric] for r in runs], dtype=float)
    xs = np.asarray(runs[0]["metrics"]["eval_step"]) if metric == "accuracy" else np.arange(1, ys.shape[1] + 1)
    mean = ys.mean(axis=0)
    half = stats.t.ppf(0.975, len(ys) - 1) * ys.std(axis=0, ddof=1) / math.sqrt(len(ys)) if len(ys) > 1 else 0 * mean
    return xs, mean, half


def _save(fig, path: Path) -> None:
    try:  # atomically: a full disk is a DiskFullError and leaves no file
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))
    finally:
        plt.close(fig)


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
    "ha_dw_authors": ("#A6761D", "H", (0, (1, 2))),
    # the why study's arms: the fixed-S ladder light to dark, then the other EBPO forms
    "ebpo_s025": ("#FDD49E", "1", "-"),
    "ebpo_s05": ("#FDBB84", "2", "-"),
    "ebpo_s075": ("#FC8D59", "3", "-"),
    "ebpo_s1": ("#D7301F", "4", "-"),
    "ebpo_glob": ("#7F0000", "8", "--"),
    "ebpo_debiased": ("#4D9221", "+", "-."),
    "ebpo_decay095": ("#542788", "x", ":"),
}
DEFAULT_COLOURS = ("#393B79", "#637939", "#8C6D31", "#843C39", "#7B4173", "#3182BD", "#E6550D", "#31A354")
DEFAULT_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")
LEGEND_PT = 9
FRACTIONS = {"zero_signal"}  # metrics in [0, 1]


def _style(est: str, k: int) -> dict:
    """Fixed colour, marker and line style per estimator (ebpo and ebpo_batch differ in all three), and a width and
    drawing order per position ``k`` so coinciding lines stay visible."""
    h = sum(ord(c) * 31**i for i, c in enumerate(est))
    default = DEFAULT_COLOURS[h % len(DEFAULT_COLOURS)], DEFAULT_MARKERS[h // 8 % len(DEFAULT_MARKERS)], "--"
    color, marker, ls = STYLES.get(est) or default
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
    """One panel per ``groups`` value of config key ``by`` among runs matching ``fixed``; per estimator the mean over
    seeds with shifted 95% t-interval bars; ``hline`` = (y, label); ``source`` printed under the figure."""
    fig, axes = panels(len(groups))
    seeds = set()
    for ax, grp in zip(axes[0], groups, strict=True):
        if hline is not None:
            ax.axhline(hline[0], label=hline[1], **REFERENCE)
        for k, est in enumerate(estimators):
            sel = select(runs, estimator=est, **{by: grp}, **fixed)
            if not sel:
                continue
            seeds.add(len(sel))
            xs, mean, half = _curve_stats(sel, metric)
            every = max(1, len(xs) // 6)
            at = np.arange(k % every, len(xs), every)
            dodge = (k - (len(estimators) - 1) / 2) * 0.012 * (xs[-1] - xs[0])
            mean_line(ax, est, k, xs, mean, half, at, xs[at] + dodge, 1.0 if metric in FRACTIONS else None)
        ax.set_title(f"{'G' if by == 'group_size' else 'order'} = {grp}", fontsize=10)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    low, top = axes[0][0].get_ylim()  # shared y; every quantity is >= 0: a line at 0 must not sit on the spine
    if -0.03 * (top - low) < low <= 0:
        axes[0][0].set_ylim(-0.04 * top, top)
    n = "/".join(str(x) for x in sorted(seeds))
    note = f"Lines: mean over {n} seeds; error bars: 95% t-intervals over seeds (shifted apart along x)."
    finish(fig, axes, CURVES[metric][1], note, source, path)


REFERENCE = {"color": "0.45", "lw": 1, "ls": (0, (1, 1)), "zorder": 1}
"""The style of a figure's dotted reference line (the warm start, the clip value)."""


def select(runs: list[dict], **config) -> list[dict]:
    """The runs whose config has the given values."""
    return [r for r in runs if all(r["config"][key] == v for key, v in config.items())]


def panels(n: int):
    """A figure of ``n`` panels side by side with a shared y axis: (figure, axes[0][i])."""
    return plt.subplots(1, n, figsize=(3.8 * n, 3.4), sharey=True, squeeze=False)


def mean_line(ax, est: str, k: int, xs, mean, half, at, x_bars, top: float | None) -> None:
    """Estimator ``est``'s mean line (``k``-th style), markers at ``at`` with 95% error bars at ``x_bars``, clipped at
    0 and ``top``."""
    style = _style(est, k)
    ax.plot(xs, mean, label=est, markevery=list(at), **style)
    low = np.minimum(half, mean)[at]  # every plotted quantity is >= 0: bars stop at 0
    high = (half if top is None else np.minimum(half, top - mean))[at]
    ax.errorbar(x_bars, mean[at], yerr=[low, high], fmt="none", ecolor=style["color"], elinewidth=1.1, capsize=2.5,
                zorder=style["zorder"])  # fmt: skip


def finish(fig, axes, ylabel: str, note: str, source: str, path: Path) -> None:
    """Label the y axis, place legend, ``note`` and ``source``, save to ``path``."""
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=LEGEND_PT, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.text(0.5, -0.02, note + (f"\n{source}" if source else ""), ha="center", va="top", fontsize=8.5)
    _save(fig, path)


def final_values(runs: list[dict], k: int = 1) -> dict[tuple[str, int, int], float]:
    """{(estimator, G, seed): final held-out pass@k} of the random-order runs (:func:`run_pass_at_k`)."""
    return {(c["estimator"], c["group_size"], c["seed"]): run_pass_at_k(r, k)
            for r in runs if (c := r["config"])["order"] == "random"}  # fmt: skip


def paired_record(a: dict[int, float], b: dict[int, float], **labels) -> dict:
    """Per-seed ``a[s] - b[s]`` over shared seeds: ``diff`` = [mean, 95% t half-width, n] (None where undefined),
    ``wins`` (seeds where ``a`` is higher), ``labels``."""
    diff = [a[s] - b[s] for s in sorted(set(a) & set(b))]
    return {**labels, "diff": ci_record(diff), "wins": int(sum(d > 0 for d in diff))}


def paired(
    runs: list[dict], estimators: list[str], gs: list[int], reference: str = "ebpo", k: int = 1, gains: bool = False
) -> list[dict]:
    """Per G (random order) and other estimator X: :func:`paired_record` of ``reference - X`` in final held-out pass@k
    (``gains``: ``X - reference``). None without ``reference``."""
    if reference not in estimators:
        return []
    final = final_values(runs, k)

    def by_seed(est: str, g: int) -> dict[int, float]:
        return {s: v for (e, gg, s), v in final.items() if e == est and gg == g}

    sides = [((x, reference) if gains else (reference, x), g) for g in gs for x in estimators if x != reference]
    return [paired_record(by_seed(a, g), by_seed(b, g), estimator=a, baseline=b, group_size=g) for (a, b), g in sides]


def format_diff(p: dict) -> str:
    """``+mean ± half (wins/n)`` of a :func:`paired_record`; "—" where no seed pairs."""
    mean, half, n = p["diff"]
    return "—" if n == 0 else pm(mean, half, sign="+") + f" ({p['wins']}/{n})"


def paired_table(pairs: list[dict], group_sizes: list[int], head: str = "EBPO - X", row: str = "baseline") -> str:
    """Markdown: one row per value of the records' ``row`` field, columns = G, cells ``mean ± half-width (wins/n)``."""
    xs = list(dict.fromkeys(p[row] for p in pairs))
    if not xs:
        return "(no pairs: the reference estimator is not in this preset)"
    at = {(p[row], p["group_size"]): p for p in pairs}
    body = [[x, *(format_diff(at[x, g]) if (x, g) in at else "—" for g in group_sizes)] for x in xs]
    return md_table([head, *(f"G={g}" for g in group_sizes)], body)


SIDES = ("ahead of", "behind", "not separated from")


def side(mean: float, half: float) -> str:
    """Where ``mean ± half`` lies: "ahead of" (above 0), "behind" (below 0) or "not separated from"."""
    return SIDES[0] if mean - half > 0 else SIDES[1] if mean + half < 0 else SIDES[2]


def _side(p: dict) -> str | None:
    """Where a record's 95% interval lies (:func:`side`); None if n < 2."""
    mean, half, n = p["diff"]
    return None if n < 2 or half is None else side(mean, half)


def paired_verdict(pairs: list[dict]) -> str:
    """One sentence per G: where EBPO - X's 95% interval lies above 0, below 0, or covers it."""
    by_g: dict[int, list[str]] = defaultdict(list)
    for p in pairs:
        if side := _side(p):
            mean, half, n = p["diff"]
            by_g[p["group_size"]].append(f"{side} {p['baseline']} ({mean:+.3f} ± {half:.3f}, wins {p['wins']}/{n})")
    return " ".join(f"G={g}: EBPO is {'; '.join(v)}." for g, v in sorted(by_g.items()))


def gains_verdict(gains: list[dict]) -> str:
    """Per G, for gains records: estimators whose 95% interval lies above 0, below it, and how many cover 0."""
    by_g: dict[int, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for p in gains:
        if side := _side(p):
            by_g[p["group_size"]][side].append(f"{p['estimator']} {format_diff(p)}")
    parts = []
    for g, sides in sorted(by_g.items()):
        base = gains[0]["baseline"]
        said = [f"{side} {base}: {', '.join(sides[side])}" for side in ("ahead of", "behind") if sides[side]]
        level = len(sides["not separated from"])
        said.append(f"{level} not separated from it" if said else f"all {level} not separated from it")
        parts.append(f"G={g}: " + "; ".join(said) + ".")
    return " ".join(parts)


def warm_start_pass_at_k(base_info: dict) -> dict[str, float | None]:
    """The warm start's held-out pass@k per :data:`COVERAGE_K` (6 decimals); None without ``heldout_pass``."""
    probs = base_info.get("heldout_pass")
    return {
        str(k): round(base_info["heldout_accuracy"] if k == 1 else pass_at_k(probs, k), 6) if probs else None
        for k in COVERAGE_K
    }


def _mean(by_cell: dict, cell: tuple, metric: str) -> float:
    return mean_ci([s.get(metric, math.nan) for s in by_cell.get(cell, [])])[0]


def study_provenance(preset, seconds: float, command: str) -> dict:
    """The study's provenance record (seeds 0..n-1, warm start seed 0; ``started`` ``seconds`` ago)."""
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
    return re.sub(r"^(\|.*)$(?!\n\|)", lambda m: f"{m[1]}\n\n*Source: {line}.*", text, flags=re.M)


FIGURE_K = tuple(2**i for i in range(7))
"""The k of the pass@k-vs-k figure: 1, 2, 4, ..., 64."""
PASS_AT_K_FIGURE = "pass_at_k.png"


def pass_at_k_figure(
    out: Path, runs: list[dict], estimators: list[str], group_sizes: list[int], base_info: dict, source: str
):
    """Draw :data:`PASS_AT_K_FIGURE` into ``out`` (per G, pass@k against log k per estimator with 95% bars, the warm
    start dotted); returns its caption."""
    probs = base_info.get("heldout_pass")
    warm = [pass_at_k(probs, k) for k in FIGURE_K] if probs else None
    ks = np.asarray(FIGURE_K, dtype=float)
    fig, axes = panels(len(group_sizes))
    seeds = set()
    for ax, g in zip(axes[0], group_sizes, strict=True):
        if warm is not None:
            ax.plot(ks, warm, label="warm start", **REFERENCE)
        for i, est in enumerate(estimators):
            sel = select(runs, estimator=est, group_size=g, order="random")
            if not sel:
                continue
            seeds.add(len(sel))
            mean, half, _ = np.asarray([mean_ci([run_pass_at_k(r, k) for r in sel]) for k in FIGURE_K]).T
            dodge = 2.0 ** ((i - (len(estimators) - 1) / 2) * 0.05)
            mean_line(ax, est, i, ks, mean, np.nan_to_num(half), np.arange(len(ks)), ks * dodge, 1.0)  # in [0, 1]
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [f"{k:g}" for k in ks])
        ax.set_title(f"G = {g}", fontsize=10)
        ax.set_xlabel("k (samples per prompt)")
        ax.grid(alpha=0.3)
    n = "/".join(str(x) for x in sorted(seeds))
    note = (
        f"Final models; lines: mean over {n} seeds of the exact pass@k (mean over held-out prompts of "
        "1 - (1 - p)^k); error bars: 95% t-intervals over seeds (shifted apart along k); dotted: the warm start."
    )
    finish(fig, axes, "held-out pass@k", note, source, out / PASS_AT_K_FIGURE)
    return "held-out pass@k of the final models against k (1 to 64), one panel per G; dotted: the warm start"
