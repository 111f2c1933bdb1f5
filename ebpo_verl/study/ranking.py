"""The equal-samples view: every G spends the same responses per step (``responses_per_step`` / G prompts), so an
estimator's best G is its best use of a fixed sample budget. Each estimator's G is chosen by 2-fold cross-fitting
over seeds; the bests are ranked and paired by seed (the report's section and its ranking figure).

Why cross-fitting: the learning rate is tuned at one G only, so no validation score exists per G, and the G with
the best held-out mean over the same seeds carries their luck (the winner's curse) into the ranking. The seeds
split by parity; the G chosen on one fold's seeds scores the other fold's, so no seed's number chose its own G."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from ebpo_verl.study import report

FIGURE = "ranking.png"
RANK_K = (1, 64)
"""The k of the held-out pass@k the view ranks (each chooses its own G)."""
FOLDS = (0, 1)


def choose_g(values: dict[tuple[int, int], float], group_sizes: list[int], seeds: list[int]) -> int | None:
    """The G with the highest mean of ``values[G, seed]`` over ``seeds`` (smaller G on a tie), or None."""
    means = {g: float(np.mean(got)) for g in group_sizes if (got := [values[g, s] for s in seeds if (g, s) in values])}
    return max(means, key=lambda g: (means[g], -g)) if means else None


def cross_fitted(
    final: dict[tuple[str, int, int], float], estimator: str, group_sizes: list[int]
) -> tuple[dict[int, float], dict[int, int | None]]:
    """One estimator's best-G value per seed: seed s takes the G chosen (:func:`choose_g`) on the other fold's seeds
    (parity 1 - s % 2), none if it did not run it. Returns ({seed: value}, {fold: G chosen on that fold's seeds})."""
    values = {(g, s): v for (e, g, s), v in final.items() if e == estimator and np.isfinite(v)}
    seeds = sorted({s for _, s in values})
    chosen = {f: choose_g(values, group_sizes, [s for s in seeds if s % 2 == f]) for f in FOLDS}
    per_seed = {s: values[g, s] for s in seeds if (g := chosen[1 - s % 2]) is not None and (g, s) in values}
    return per_seed, chosen


def equal_samples(runs: list[dict], estimators: list[str], group_sizes: list[int], k: int = 1) -> dict:
    """The ranking of the estimators' cross-fitted best-G final held-out pass@k (random order), best first (ties
    and empty rows by name, empty last). Each row: ``best`` [mean, 95% t half-width, n] over the seeds
    (:func:`cross_fitted`), the G chosen on each fold, the in-sample best G (chosen on all seeds, so optimistic) with
    its cell's statistics, and paired differences by seed: ``vs_leader`` = leader - X, ``vs_next`` = X - next row."""
    final = report.final_values(runs, k)
    rows, per_seed = [], {}
    for e in estimators:
        per_seed[e], chosen = cross_fitted(final, e, group_sizes)
        cell = {(g, s): v for (x, g, s), v in final.items() if x == e and np.isfinite(v)}
        g_all = choose_g(cell, group_sizes, sorted({s for _, s in cell}))
        rows.append({
            "estimator": e,
            "best": report.ci_record(list(per_seed[e].values())),
            "g_chosen_on_even_seeds": chosen[0],
            "g_chosen_on_odd_seeds": chosen[1],
            "in_sample_g": g_all,
            "in_sample": report.ci_record([v for (g, _), v in cell.items() if g == g_all]),
        })  # fmt: skip
    rows.sort(key=lambda r: (r["best"][0] is None, -(r["best"][0] or 0.0), r["estimator"]))
    for i, r in enumerate(rows):
        lead, e = rows[0]["estimator"], r["estimator"]
        r["vs_leader"] = report.paired_record(per_seed[lead], per_seed[e], estimator=lead, baseline=e)
        nxt = rows[i + 1]["estimator"] if i + 1 < len(rows) else None
        r["vs_next"] = report.paired_record(per_seed[e], per_seed[nxt], estimator=e, baseline=nxt) if nxt else None
    return {"k": k, "metric": f"pass@{k}", "folds": "seed % 2", "ranking": rows}


def _cell(stat: list) -> str:
    mean, half, n = stat
    return "—" if n == 0 else report.pm(mean, half) + f" ({n})"


def ranking_table(view: dict) -> str:
    """Markdown: the ranking of :func:`equal_samples`, one row per estimator."""
    m = view["metric"]
    head = ["rank", "estimator", "G chosen on even / odd seeds", f"best-G {m}, cross-fitted (seeds)", "leader - X",
            "X - next", f"in-sample best G: {m} (seeds)"]  # fmt: skip
    rows = []
    for i, r in enumerate(view["ranking"], 1):
        lead = "—" if i == 1 else report.format_diff(r["vs_leader"])
        nxt = report.format_diff(r["vs_next"]) if r["vs_next"] else "—"
        chosen = f"{r['g_chosen_on_even_seeds'] or '—'} / {r['g_chosen_on_odd_seeds'] or '—'}"
        in_sample = f"G={r['in_sample_g']}: {_cell(r['in_sample'])}" if r["in_sample_g"] else "—"
        rows.append([str(i), r["estimator"], chosen, _cell(r["best"]), lead, nxt, in_sample])
    return report.md_table(head, rows)


def ranking_verdict(view: dict) -> str:
    """Who leads, whom the leader's paired 95% interval separates it from, whom not, and who has < 2 shared seeds."""
    rows = view["ranking"]
    if not rows or rows[0]["best"][2] == 0:
        return "No estimator has a cross-fitted value yet."
    sides: dict[str, list[str]] = {"ahead": [], "level": [], "unpaired": []}
    for r in rows[1:]:
        sides[{None: "unpaired", "ahead of": "ahead"}.get(report._side(r["vs_leader"]), "level")].append(r["estimator"])
    mean, half, n = rows[0]["best"]
    text = f"Leader in {view['metric']}: {rows[0]['estimator']}, {report.pm(mean, half)} over {n} seeds."
    said = [f"its paired 95% interval is above 0 against {', '.join(sides['ahead'])}"] if sides["ahead"] else []
    if sides["level"]:
        said.append(f"it covers 0 against {', '.join(sides['level'])}")
    if sides["unpaired"]:
        said.append(f"fewer than 2 seeds pair with {', '.join(sides['unpaired'])}")
    if not sides["ahead"] and sides["level"]:
        said.append("no single winner")
    body = "; ".join(said)
    return f"{text} {body[0].upper()}{body[1:]}." if said else text


def _label(row: dict) -> str:
    """A row's name on the figure: the estimator and the G chosen on each fold (or that it has no value)."""
    if row["best"][2] == 0:
        return f"{row['estimator']} (no run yet)"
    chosen = [row["g_chosen_on_even_seeds"], row["g_chosen_on_odd_seeds"]]
    return f"{row['estimator']} (G {'/'.join('-' if g is None else str(g) for g in chosen)})"


def ranking_figure(views: list[dict], runs: list[dict], group_sizes: list[int], path: Path, source: str) -> None:
    """One panel per :func:`equal_samples` view: ranked best-G means, 95% t-intervals, G means as digits."""
    n = max(len(v["ranking"]) for v in views)
    fig, axes = plt.subplots(1, len(views), figsize=(5.2 * len(views), 0.42 * n + 1.4), squeeze=False)
    for ax, view in zip(axes[0], views, strict=True):
        final = report.final_values(runs, view["k"])
        rows = view["ranking"]
        ys = np.arange(len(rows))[::-1]
        for y, (i, r) in zip(ys, enumerate(rows), strict=True):
            e = r["estimator"]
            for g in group_sizes:
                cell = [v for (x, gg, _), v in final.items() if x == e and gg == g and np.isfinite(v)]
                if cell:
                    ax.text(np.mean(cell), y + 0.22, str(g), color="0.5", fontsize=7, ha="center", va="center")
            mean, half, _ = r["best"]
            if mean is None:
                continue
            style = report._style(e, i)
            ax.errorbar(mean, y, xerr=half or 0.0, fmt=style["marker"], color=style["color"], ms=6, capsize=3)
        ax.set_yticks(ys, [_label(r) for r in rows])
        ax.set_xlabel(f"final held-out {view['metric']}")
        ax.set_title(f"best G per estimator, {view['metric']}", fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    note = (
        "Markers: each estimator's cross-fitted best-G mean over seeds (G chosen on the other half of the seeds, in "
        "brackets: chosen on even / odd seeds), bars: 95% t-intervals over seeds; grey digits: each G's cell mean."
    )
    fig.text(0.5, -0.01, note + (f"\n{source}" if source else ""), ha="center", va="top", fontsize=8)
    fig.tight_layout()
    report._save(fig, path)


def section(runs: list[dict], estimators: list[str], group_sizes: list[int], responses: int) -> tuple[str, dict]:
    """The equal-samples section at each k of :data:`RANK_K` and the views; none for a one-G preset."""
    if len(group_sizes) < 2:
        return "", {}
    views = {str(k): equal_samples(runs, estimators, group_sizes, k) for k in RANK_K}
    parts = [
        f"""## Equal samples per step: each estimator's best G
Every G spends the same {responses} sampled responses per step ({responses}/G prompts), so an estimator's best G
is its best use of a fixed sample budget. How the G is chosen: the learning-rate tuning ran at one G only, so no
validation score exists per G, and the best held-out mean over the same seeds would carry their luck into the
ranking. So the seeds split by parity: the G with the highest held-out mean over the even seeds scores the odd
seeds, and the G chosen on the odd seeds scores the even ones (ties: the smaller G); each seed's number comes
from a G chosen without it. The rows are ranked by the mean of those numbers (95% t-interval, seeds in
brackets); "leader - X" and "X - next" are paired by seed (mean ± 95% half-width, in brackets the seeds where the
first is higher / the seeds both have); two runs of one seed at different G share the warm start and the seed
but not the prompts of a step, so pairing removes less noise there than within a G. The last column is the G
with the best mean over all seeds and that cell's own numbers: chosen on the numbers it shows, so optimistic.
Figure: [{FIGURE}]({FIGURE})."""
    ]
    for view in views.values():
        parts.append(f"### Ranked by held-out {view['metric']}\n\n{ranking_table(view)}\n\n{ranking_verdict(view)}")
    return "\n\n".join(parts) + "\n\n", views
