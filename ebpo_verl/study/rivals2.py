"""The rivals' table that decides (issue 47): the top group of estimators at G = 2, 4, 8, 16 on three task mixes
(regimes), each with its own warm start and splits; learning rates tuned per estimator and G on seeds disjoint from
the test seeds; paired differences with plain and Holm-adjusted 95% intervals over every pair of the top group.

``python -m ebpo_verl.study --preset rivals2 --out DIR`` saves each run when it ends (:func:`runner.run_grid`); a
rerun recomputes every decision (rate choices, grid extensions) from the saved runs, so it resumes."""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy import stats

from ebpo_verl.ops.atomic import atomic_write_text
from ebpo_verl.ops.errors import shorten
from ebpo_verl.study import report, runner
from ebpo_verl.study.presets import PRESETS, Preset, TunedPlan
from ebpo_verl.study.ranking import _cell
from ebpo_verl.study.report import SIDES, side
from ebpo_verl.study.rl import RLConfig

TOP_GROUP = ("ebpo", "ebpo_batch", "spo", "dbb", "running_norm", "jspo", "jspo_history", "grpo")
"""The estimators the table decides between (grpo as the reference), the same in every regime."""
REST = ("rloo", "otb", "bnpo", "krpo", "ha_dw", "ha_dw_authors")
"""The other rivals: rows of the first regime only (both forms of HA-DW: the paper's and its authors' code)."""
CROSS_MACHINE_SPREAD = 0.015
"""How far another machine moved a cell mean of docs/study_rivals (4-6 seeds, unpaired). Kept for readers of the
committed summary.json (``cross_machine_spread``, :func:`pairs`' ``within_spread``); no sentence uses it as a verdict
(issue 52): it is not a paired quantity, and the paired 16-seed intervals already contain trajectory divergence."""
ALPHA = 0.05
POWER = 0.8
"""The power at which the page states the detectable difference of a pair not separated (:func:`mde`)."""
EBPO_AGAINST = ("ebpo_batch", "grpo", "running_norm")
"""The closing note's comparisons: EBPO against its released form (no cross-step memory), GRPO, a running norm."""


class RegimeError(ValueError):
    """A regime's warm start misses the pass-rate share its regime requires."""


@dataclass(frozen=True)
class Regime:
    """A task mix and ``below_005``: (low, high) bounds on its warm start's share of RL prompts below a 0.05 pass
    rate; ``with_rest``: the :data:`REST` rivals run in it too."""

    name: str
    topics: tuple[str, ...] = ("add", "sub")
    levels: tuple[int, ...] = (2, 3)
    misconception: float = 0.8
    below_005: tuple[float, float] = (0.0, 1.0)
    with_rest: bool = False


REGIMES = (
    Regime("current", with_rest=True),
    Regime("hard", levels=(3,), below_005=(0.5, 1.0)),
    Regime("easy", misconception=0.3, below_005=(0.0, 0.1)),
)
"""Shares of RL prompts below 0.05 on the rivals preset's warm starts (2026-12-04): current 0.29; hard (3-digit
problems only) 0.62, none above 0.3; easy (misconception share 0.3) 0.006, pass rates spread over 0..1."""


@dataclass(frozen=True)
class Plan(TunedPlan):
    """The study: ``scale`` (a preset) gives the RL run, splits and warm start; each regime tunes then tests ``top``
    at ``top_gs`` x ``top_seeds`` seeds (where ``with_rest``, ``rest`` at ``rest_gs`` x ``rest_seeds`` too). Tuning:
    every rate of ``lr_grid`` at ``tune_gs`` on ``tune_seeds`` seeds from ``tune_seed0`` (validation split); an
    untuned G takes the nearest tuned G's rate (the smaller on a tie). A choice at the grid's edge adds the next rate
    (x2 or /2), at most ``max_extensions`` times per slot, while the study stays within ``run_cap`` runs.
    ``check_regimes``: refuse a warm start outside its regime's bounds."""

    name: str
    scale: Preset
    regimes: tuple[Regime, ...] = REGIMES
    top: tuple[str, ...] = TOP_GROUP
    rest: tuple[str, ...] = REST
    top_gs: tuple[int, ...] = (2, 4, 8, 16)
    rest_gs: tuple[int, ...] = (2, 4, 8)
    tune_gs: tuple[int, ...] = (2, 8)
    top_seeds: int = 16
    rest_seeds: int = 6
    tune_seeds: int = 4
    tune_seed0: int = 1000
    lr_grid: tuple[float, ...] = (7.5e-5, 1.5e-4, 3e-4)
    max_extensions: int = 2
    run_cap: int = 2500
    check_regimes: bool = True

    def arms(self) -> tuple[str, ...]:
        return (*self.top, *self.rest)

    def problem(self) -> str | None:
        if self.tune_seed0 < max(self.top_seeds, self.rest_seeds):
            return f"tune_seed0 {self.tune_seed0} overlaps the test seeds; raise it"
        return None

    def estimators(self, regime: Regime) -> tuple[str, ...]:
        return (*self.top, *self.rest) if regime.with_rest else self.top

    def preset(self, regime: Regime) -> Preset:
        """The regime's scale preset: its task mix, its estimators (for the runner's progress bar and workers)."""
        return replace(self.scale, name=f"{self.name}/{regime.name}", topics=regime.topics, levels=regime.levels,
                       misconception=regime.misconception, estimators=self.estimators(regime),
                       group_sizes=self.top_gs, seeds=self.top_seeds, order_estimators=(), lr={}, lr_grid={},
                       tune=None)  # fmt: skip

    def slots(self, regime: Regime) -> list[tuple[str, int]]:
        """(estimator, tuned G) of the regime's tuning."""
        return [(e, g) for e in self.estimators(regime) for g in self.tune_gs]

    def tuning_jobs(self, rates: dict[tuple[str, int], list[float]]) -> list[RLConfig]:
        """Every estimator and tuned G (``rates``' keys) at each of its rates and tuning seed (validation split)."""
        return [
            RLConfig(estimator=e, group_size=g, seed=s, lr=lr, split="validation", **self.scale.rl)
            for (e, g), lrs in rates.items()
            for lr in lrs
            for s in self.tuning_seeds
        ]

    def test_jobs(self, regime: Regime, lrs: dict[str, dict[int, float]]) -> list[RLConfig]:
        """The regime's test runs (test split), each estimator at each G at its rate ``lrs[estimator][G]``."""
        rows = [(e, self.top_gs, self.top_seeds) for e in self.top]
        rows += [(e, self.rest_gs, self.rest_seeds) for e in self.rest] if regime.with_rest else []
        return [
            RLConfig(estimator=e, group_size=g, seed=s, lr=lrs[e][g], **self.scale.rl)
            for e, gs, n in rows
            for g in gs
            for s in range(n)
        ]

    def nearest_tuned(self, g: int) -> int:
        return min(self.tune_gs, key=lambda t: (abs(t - g), t))

    def planned_runs(self) -> int:
        """Tuning on the initial grid plus every test run (grid extensions come on top, within ``run_cap``)."""
        lrs = {e: dict.fromkeys((*self.top_gs, *self.rest_gs), 1.0) for e in (*self.top, *self.rest)}
        grid = {slot: list(self.lr_grid) for slot in self.slots(Regime("x", with_rest=True))}
        return sum(
            len(self.tuning_jobs({s: grid[s] for s in self.slots(r)})) + len(self.test_jobs(r, lrs))
            for r in self.regimes
        )


PLANS: dict[str, Plan] = {
    # Issue 47's study (the Plan defaults: docs/study_rivals2_PLAN.md) at the rivals preset's scale.
    "rivals2": Plan(name="rivals2", scale=PRESETS["rivals"]),
    # The same code paths in about 2 minutes: 3 estimators, 2 rates (every first choice is at an edge), 4 steps.
    "rivals2_tiny": Plan(
        name="rivals2_tiny",
        scale=replace(
            PRESETS["tiny"],
            split_sizes={"val": 30, "heldout": 30, "train": 60, "sft": 1000},
            sft_steps=300,
            rl={"steps": 4, "responses_per_step": 32, "eval_every": 2, "grad_clip": 5.0},
        ),
        top=("ebpo", "ebpo_batch", "grpo"),
        rest=("ha_dw_authors",),
        top_seeds=3,
        rest_seeds=2,
        tune_seeds=2,
        lr_grid=(1.5e-4, 3e-4),
        max_extensions=1,
        check_regimes=False,
    ),
}
DURATION = {
    "rivals2": "measured: the committed docs/study_rivals2/ summed 66,556 process-seconds of warm starts and runs"
    " (9.2 h over 2 processes on shared cores, 2026-12-04 21:42 to 12-05 09:01 UTC); extrapolated: about 3.3 h on 2"
    " idle cores at the 9.7 s a run per process of its last 742 runs",
    "rivals2_tiny": "about 1-2 min",
}


# ----------------------------------------------------------------------------------------------- learning rates


def lr_choice(scores: dict[float, dict[int, float]]) -> dict:
    """From {rate: {seed: score}}: the rates tried, each one's [mean, half-width, n], the chosen rate (highest mean,
    the smaller on a tie), the paired records chosen - neighbour by seed, ``separated`` (every one ahead of 0) and
    ``edge`` ("low", "high" or None)."""
    choice = runner.rate_choice({r: list(by_seed.values()) for r, by_seed in scores.items()})
    rates, chosen = choice["values"], choice["chosen"]
    i = rates.index(chosen)
    near = [rates[j] for j in (i - 1, i + 1) if 0 <= j < len(rates)]
    vs = [report.paired_record(scores[chosen], scores[r], estimator=chosen, baseline=r) for r in near]
    return {
        **choice,
        "vs_neighbours": vs,
        "separated": bool(vs) and all(report._side(v) == SIDES[0] for v in vs),
        "edge": "low" if i == 0 else "high" if i == len(rates) - 1 else None,
    }


def extensions(
    choices: dict, rates: dict, base_grid: tuple[float, ...], max_ext: int, room: int, cost: int
) -> list[tuple[tuple[str, int], float]]:
    """The rates to add, in slot order: beyond each choice at the grid's edge (x2 at the high edge, /2 at the low
    one), for a slot with fewer than ``max_ext`` extensions so far, while ``room`` runs (``cost`` a rate) last."""
    add = []
    for slot, c in choices.items():
        if c["edge"] is None or len(rates[slot]) - len(base_grid) >= max_ext or room < cost:
            continue
        add.append((slot, c["chosen"] * (2 if c["edge"] == "high" else 0.5)))
        room -= cost
    return add


def tune(
    plan: Plan, regime: Regime, base, out: Path, room: int, workers: int | None, train: bool = True
) -> tuple[dict, int, list]:
    """The regime's tuning in rounds (the grid, then its extensions): {slot: :func:`lr_choice` + ``extended``},
    the run room left and the tuning runs. A run's score: its mean validation accuracy after step 0. ``train=False``
    (a report): :class:`runner.NotSavedYet` unless every round's runs are saved."""
    rates = {slot: list(plan.lr_grid) for slot in plan.slots(regime)}
    while True:
        jobs = plan.tuning_jobs(rates)
        runs, _ = runner.run_grid(plan.preset(regime), base, out, jobs, workers, train)
        if len(runs) < len(jobs):
            raise runner.NotSavedYet(f"regime {regime.name}: {len(runs)} of {len(jobs)} tuning runs saved")
        scores: dict = {}
        for run in runs:
            c, score = run["config"], runner.tuning_score(run)
            scores.setdefault((c["estimator"], c["group_size"]), {}).setdefault(c["lr"], {})[c["seed"]] = score
        choices = {slot: lr_choice(scores[slot]) for slot in rates}
        add = extensions(choices, rates, plan.lr_grid, plan.max_extensions, room, plan.tune_seeds)
        if not add:
            break
        for slot, lr in add:
            rates[slot].append(lr)
        room -= len(add) * plan.tune_seeds
    for slot, c in choices.items():
        c["extended"] = len(rates[slot]) - len(plan.lr_grid)
    return choices, room, runs


def rates_used(plan: Plan, regime: Regime, choices: dict) -> dict[str, dict[int, float]]:
    """{estimator: {G: rate}}: each G's rate is the choice at the nearest tuned G."""
    gs = sorted({*plan.top_gs, *plan.rest_gs})
    return {e: {g: choices[e, plan.nearest_tuned(g)]["chosen"] for g in gs} for e in plan.estimators(regime)}


# ----------------------------------------------------------------------------------------------- statistics


def holm(pvalues: list[float], alpha: float = ALPHA) -> tuple[list[float], list[float]]:
    """Holm's step-down procedure over ``pvalues``: the adjusted p-values (max over the ranks up to each of
    min(1, (m - rank) p)) and each hypothesis's interval level: alpha / (m - rank) for the rank in ascending p up to
    the first hypothesis not rejected, and that one's level for it and every later one, so an interval excludes 0
    exactly where Holm rejects (the sequentially rejective intervals of Holm 1979, Scand. J. Statist. 6:65-70)."""
    m = len(pvalues)
    adjusted, levels = [1.0] * m, [alpha] * m
    running, stop = 0.0, None
    for rank, i in enumerate(sorted(range(m), key=lambda j: pvalues[j])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
        if stop is None and pvalues[i] > alpha / (m - rank):
            stop = rank
        levels[i] = alpha / (m - (rank if stop is None else stop))
    return adjusted, levels


def pairs(final: dict[str, dict[int, float]], names: tuple[str, ...]) -> list[dict]:
    """Every pair (a, b) of ``names`` (in their order) with a - b by seed: mean, plain 95% half-width, the one-sample
    t-test's p, Holm's adjusted p and half-width (:func:`holm` over these pairs), both verdicts (:func:`side`), the
    seeds where a is higher, and whether the mean is within :data:`CROSS_MACHINE_SPREAD`."""
    recs, errors = [], []
    for a, b in itertools.combinations(names, 2):
        seeds = sorted(set(final.get(a, {})) & set(final.get(b, {})))
        if len(seeds) < 2:
            continue
        x = np.asarray([final[a][s] - final[b][s] for s in seeds], dtype=float)
        mean, se, df = float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x))), len(x) - 1
        p = float(stats.ttest_1samp(x, 0.0).pvalue) if se > 0 else (0.0 if mean != 0 else 1.0)
        half = float(stats.t.ppf(1 - ALPHA / 2, df) * se)
        recs.append({"a": a, "b": b, "n": len(seeds), "wins": int((x > 0).sum()), "mean": mean, "half": half, "p": p})
        errors.append((se, df))
    adjusted, levels = holm([r["p"] for r in recs])
    for r, adj, level, (se, df) in zip(recs, adjusted, levels, errors, strict=True):
        r["p_holm"], r["holm_level"] = adj, level
        r["holm_half"] = float(stats.t.ppf(1 - level / 2, df) * se)
        r["plain"], r["holm"] = side(r["mean"], r["half"]), side(r["mean"], r["holm_half"])
        r["within_spread"] = abs(r["mean"]) < CROSS_MACHINE_SPREAD
    return recs


def mde(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The minimum detectable effect of a two-sided paired t-test: the true mean difference it finds at level
    ``alpha`` with probability ``power`` over ``n`` seeds whose differences have standard deviation ``sd``,
    MDE = (t_{1-alpha/2, n-1} + t_{power, n-1}) sd / sqrt(n) (the usual approximation: it ignores the far tail)."""
    if not (n >= 2 and sd >= 0 and 0 < alpha < 1 and 0 < power < 1):
        raise ValueError(
            f"mde: needs n >= 2 seeds, sd >= 0, alpha and power in (0, 1); got sd={shorten(sd)}, n={shorten(n)}, "
            f"alpha={shorten(alpha)}, power={shorten(power)}"
        )
    df = n - 1
    return float((stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * sd / math.sqrt(n))


def paired_diffs(final: dict, a: str, b: str, g: str) -> np.ndarray:
    """a - b by seed at G ``g`` from a regime's ``final`` ({estimator: {G: {seed: value}}}), the seeds both have."""
    seeds = sorted(set(final[a][g]) & set(final[b][g]), key=int)
    return np.asarray([final[a][g][s] - final[b][g][s] for s in seeds], dtype=float)


# ----------------------------------------------------------------------------------------------- the study


def run_plan(plan: Plan, out: Path, command: str, workers: int | None = None, study_dir: Path | None = None) -> str:
    """Warm starts (checked against each regime's histogram bounds), then per regime its tuning and test runs,
    then ``study.md``, ``summary.json`` and the figures in ``out``; returns the page's closing note. With
    ``study_dir`` (a report): nothing is trained or written there; the regimes whose tuning it has saved."""
    t0 = time.perf_counter()
    src, train = study_dir or out, study_dir is None
    bases, infos = {}, {}
    for r in plan.regimes:
        if train:
            (out / r.name).mkdir(parents=True, exist_ok=True)
        try:
            bases[r.name] = runner.prepare_base(plan.preset(r), src / r.name, train=train)
        except runner.NotSavedYet:
            break
        infos[r.name] = runner.describe_base(bases[r.name])
        share = infos[r.name]["frac_train_below_0.05"]
        if plan.check_regimes and not r.below_005[0] <= share <= r.below_005[1]:
            raise RegimeError(
                f"regime {r.name}: {share:.2f} of the RL prompts below a 0.05 pass rate, outside "
                f"{r.below_005}; change its task mix in ebpo_verl/study/rivals2.py"
            )
    room = plan.run_cap - plan.planned_runs()
    results, n_tuning, n_test, run_seconds = {}, 0, 0, sum(i["sft_seconds"] for i in infos.values())
    for r in (r for r in plan.regimes if r.name in bases):
        try:
            choices, room, tuning = tune(plan, r, bases[r.name], src / r.name, room, workers, train)
        except runner.NotSavedYet:
            if train:
                raise
            break
        lrs = rates_used(plan, r, choices)
        runs, _ = runner.run_grid(plan.preset(r), bases[r.name], src / r.name, plan.test_jobs(r, lrs), workers, train)
        n_tuning, n_test = n_tuning + len(tuning), n_test + len(runs)
        run_seconds += sum(x["seconds"] for x in (*tuning, *runs))
        results[r.name] = regime_summary(plan, r, infos[r.name], choices, lrs, runs)
    if not results:
        raise runner.NotSavedYet(f"{src}: no regime's tuning is saved yet; nothing to report")
    seconds = round(time.perf_counter() - t0, 1)
    data = study_data(plan, results, command, seconds, n_tuning, n_test, round(run_seconds, 1))
    figures(out, plan, data)
    atomic_write_text(out / "summary.json", json.dumps(data, indent=1) + "\n")
    atomic_write_text(out / "study.md", page(data))
    return closing_note(data)


def study_data(
    plan: Plan, results: dict, command: str, seconds: float, n_tuning: int, n_test: int, run_seconds: float
) -> dict:
    """summary.json: the plan's seed lists, groups and scale, the provenance, each regime's record, the wall time
    of the last command (``wall_seconds``: a resumed study's last part) and ``run_seconds``, the sum of every warm
    start's and run's own wall time (over all the commands; divide by the workers for the study's)."""
    return {
        "plan": plan.name,
        "command": command,
        "wall_seconds": seconds,
        "run_seconds": run_seconds,
        "workers": plan.scale.workers,
        "n_runs": {"tuning": n_tuning, "test": n_test, "cap": plan.run_cap},
        "tuning_seeds": plan.tuning_seeds,
        "test_seeds": {"top": list(range(plan.top_seeds)), "rest": list(range(plan.rest_seeds))},
        "top_group": list(plan.top),
        "rest": list(plan.rest),
        "group_sizes": list(plan.top_gs),
        "cross_machine_spread": CROSS_MACHINE_SPREAD,
        "alpha": ALPHA,
        "steps": plan.scale.rl["steps"],
        "responses_per_step": plan.scale.rl["responses_per_step"],
        "provenance": report.provenance(
            seed={"tuning": plan.tuning_seeds, "test": list(range(plan.top_seeds))},
            command=command,
            started=time.time() - seconds,
        ),
        "regimes": results,
    }


def regime_summary(plan: Plan, regime: Regime, info: dict, choices: dict, lrs: dict, runs: list[dict]) -> dict:
    """A regime's record for summary.json: its mix and histogram, the tuning, the rates used, every run's final
    held-out accuracy by seed, and per G the top group's :func:`pairs` and winners (those no other is ahead of
    under Holm; one name: a separated winner)."""
    final: dict[str, dict[int, dict[int, float]]] = {}
    for (e, g, s), v in report.final_values(runs).items():  # every run is in random order
        final.setdefault(e, {}).setdefault(g, {})[s] = v
    recs = {g: pairs({e: final[e][g] for e in plan.top if g in final.get(e, {})}, plan.top) for g in plan.top_gs}
    beaten = {g: {r["b"] if r["holm"] == SIDES[0] else r["a"] for r in recs[g] if r["holm"] != SIDES[2]} for g in recs}
    return {
        "mix": {"topics": list(regime.topics), "levels": list(regime.levels), "misconception": regime.misconception},
        "below_005_bounds": list(regime.below_005),
        "pass_rate_histogram": info["pass_rate_histogram"],
        "frac_train_below_0.05": info["frac_train_below_0.05"],
        "frac_train_above_0.95": info["frac_train_above_0.95"],
        "warm_start_heldout_accuracy": info["heldout_accuracy"],
        "estimators": list(plan.estimators(regime)),
        "tuning": {f"{e}@{g}": c for (e, g), c in choices.items()},
        "lr_used": {e: {str(g): v for g, v in d.items()} for e, d in lrs.items()},
        "final": {
            e: {str(g): {str(s): v for s, v in sorted(d.items())} for g, d in sorted(gd.items())}
            for e, gd in final.items()
        },
        "pairs": {str(g): recs[g] for g in plan.top_gs},
        "winners": {str(g): [e for e in plan.top if e not in beaten[g]] for g in plan.top_gs},
        "wall_seconds_runs": round(sum(r["seconds"] for r in runs), 1),
    }


# ----------------------------------------------------------------------------------------------- the page


def _pair(recs: list[dict], a: str, b: str) -> dict | None:
    return next((r for r in recs if {r["a"], r["b"]} == {a, b}), None)


def family(recs: list[dict]) -> str:
    """The Holm family a cell's sentence names: its own pairs, not the regime's or the study's."""
    return f"Holm-adjusted 95% over the cell's {len(recs)} pairs"


def _not_separated(final: dict, a: str, b: str, g: str) -> str:
    """For a - b not separated under Holm: the plain 95% upper bound (and the plain verdict where that interval
    excludes 0) and the difference detectable at :data:`POWER` (:func:`mde`), from the per-seed values."""
    x = paired_diffs(final, a, b, g)
    sd = float(x.std(ddof=1))
    upper = float(x.mean()) + float(stats.t.ppf(1 - ALPHA / 2, len(x) - 1)) * sd / math.sqrt(len(x))
    plain = side(float(x.mean()), upper - float(x.mean()))
    also = "" if plain == SIDES[2] else f", {plain} {b} in the plain interval"
    return f"; 95% upper bound {upper:+.4f}{also}; detectable at {POWER:.0%} power: {mde(sd, len(x)):.4f}"


def closing_note(data: dict) -> str:
    """Per regime and G, under Holm over the cell's pairs: the separated winner (or "none separated" and who no one
    is ahead of), and ebpo against ebpo_batch, grpo and running_norm with both intervals and seeds (where not
    separated: the upper bound and the detectable difference); then the measured times."""
    lines = ["## Closing note", ""]
    for name, reg in data["regimes"].items():
        for g, recs in reg["pairs"].items():
            win = reg["winners"][g]
            head = (
                f"separated winner: {win[0]}"
                if len(win) == 1
                else f"none separated (no one ahead of: {', '.join(win)})"
            )
            said = []
            for other in EBPO_AGAINST:
                if (r := _pair(recs, "ebpo", other)) is not None:
                    mean, h = (1 if r["a"] == "ebpo" else -1) * r["mean"], r["holm_half"]
                    verdict = side(mean, h)
                    extra = _not_separated(reg["final"], "ebpo", other, g) if verdict == SIDES[2] else ""
                    said.append(
                        f"ebpo is {verdict} {other} ({report.pm(mean, r['half'], 4, '+')} plain, "
                        f"± {h:.4f} Holm, {r['n']} seeds{extra})"
                    )
            lines.append(f"- Regime {name}, G={g}, {family(recs)}: {head}; " + "; ".join(said) + ".")
    n = data["n_runs"]
    lines += [
        "",
        f"Measured times: {data['wall_seconds']:.0f} s of wall time for the last command; {data['run_seconds']:.0f} "
        f"process-seconds of warm starts and runs in all, summed over the commands and the {data['workers']} "
        f"processes ({n['tuning'] + n['test']} runs: {n['tuning']} tuning, {n['test']} test).",
    ]
    return "\n".join(lines) + "\n"


TUNING_HEAD = ["estimator", "tuned at G", "rates tried: validation score", "chosen",
               "separated from its neighbours (chosen - neighbour, seeds ahead/n)", "grid"]  # fmt: skip
VERDICTS = (("plain", "half", "plain 95%"), ("holm", "holm_half", "Holm-adjusted 95%"))
"""The page's two verdict lines per regime and G: (record key, half-width key, label; the Holm line names its
family, :func:`family`)."""


def tuning_table(reg: dict) -> str:
    """Per estimator and tuned G: the rates tried with their validation scores, the choice, separation, edge."""
    rows = []
    for slot, c in reg["tuning"].items():
        tried = ", ".join(f"{v:g}: {s[0]:.3f}" for v, s in zip(c["values"], c["validation"], strict=True))
        vs = "; ".join(report.format_diff(v) + f" vs {v['baseline']:g}" for v in c["vs_neighbours"])
        separated = ("yes" if c["separated"] else "no") + f" ({vs})"
        edge = f"at the {c['edge']} edge" if c["edge"] else "inside"
        rows.append([*slot.split("@"), tried, f"{c['chosen']:g}", separated, f"{edge}, {c['extended']} extension(s)"])
    return report.md_table(TUNING_HEAD, rows)


def page(data: dict) -> str:
    """study.md: the protocol, then per regime its histogram, tuning, table and verdicts, then the closing note."""
    gs = data["group_sizes"]
    parts = [
        f"# The rivals' table that decides ({data['plan']})\n",
        f"Command: `{data['command']}`. {data['steps']} RL steps of {data['responses_per_step']} responses at every "
        f"G. Tuning seeds {data['tuning_seeds']} (validation split), test seeds "
        f"0..{len(data['test_seeds']['top']) - 1} for {', '.join(data['top_group'])} and "
        f"0..{len(data['test_seeds']['rest']) - 1} for "
        f"{', '.join(data['rest'])} (first regime only). Paired differences by seed, plain 95% t-intervals and "
        f"Holm-adjusted ones. Each (regime, G) cell is its own Holm family: the "
        f"{len(list(itertools.combinations(data['top_group'], 2)))} pairs of the top group at that G (a family over "
        f"more cells adjusts more and can separate fewer). Where a pair is not separated, the closing note gives the "
        f"plain 95% upper bound of the difference and the difference detectable at {POWER:.0%} power, MDE = "
        f"(t_(1-alpha/2, n-1) + t_({POWER}, n-1)) sd / sqrt(n), sd the standard deviation of the n paired "
        f"differences, alpha {data['alpha']}.\n",
    ]
    for name, reg in data["regimes"].items():
        mix = reg["mix"]
        cells = [[e, *(_cell(report.mean_ci(reg["final"].get(e, {}).get(str(g), {}).values())) for g in gs)]
                 for e in reg["estimators"]]  # fmt: skip
        parts += [
            f"## Regime {name}\n",
            f"Mix: topics {mix['topics']}, levels {mix['levels']}, misconception share {mix['misconception']}. "
            f"Warm start: {reg['frac_train_below_0.05']:.2f} of the RL prompts below a 0.05 pass rate (bounds "
            f"{reg['below_005_bounds']}), {reg['frac_train_above_0.95']:.2f} above 0.95; pass-rate histogram "
            f"(tenths) {reg['pass_rate_histogram']}; held-out accuracy {reg['warm_start_heldout_accuracy']:.3f}.\n",
            "### Learning rates\n",
            tuning_table(reg) + "\n",
            "### Final held-out accuracy (mean ± 95% half-width, seeds)\n",
            report.md_table(["estimator", *(f"G={g}" for g in gs)], cells) + "\n",
            "### Paired verdicts (a - b by seed)\n",
        ]
        for g, recs in reg["pairs"].items():
            for kind, half, label in VERDICTS:
                said = [f"{r['a']} is {r[kind]} {r['b']} ({report.pm(r['mean'], r[half], sign='+')}, {r['n']} seeds)"
                        for r in recs]  # fmt: skip
                label = family(recs) if kind == "holm" else label
                parts.append(f"- Regime {name}, G={g}, {label}: " + ("; ".join(said) or "no pairs yet") + ".")
        parts.append("")
    parts.append(
        "Figures: [regimes.png](regimes.png) (accuracy against G per regime), [differences.png]"
        "(differences.png) (ebpo against ebpo_batch, grpo, running_norm per regime), [histograms.png]"
        "(histograms.png) (the warm starts' pass rates).\n"
    )
    return "\n".join(parts) + "\n" + closing_note(data)


def figures(out: Path, plan: Plan, data: dict) -> None:
    """regimes.png: per regime, the top group's final held-out accuracy against G (mean, 95% t-interval);
    differences.png: per regime, ebpo - X against G for X in :data:`EBPO_AGAINST` (Holm-adjusted bars, the plain
    ones thin); histograms.png: each regime's warm-start pass-rate histogram."""
    import matplotlib.pyplot as plt

    regs, source = data["regimes"], report.source_line(plan.name, data["provenance"])
    xs = np.asarray(plan.top_gs, dtype=float)
    fig, axes = report.panels(len(regs))
    for ax, (name, reg) in zip(axes[0], regs.items(), strict=True):
        for k, e in enumerate(plan.top):
            stat = np.asarray([report.mean_ci(reg["final"].get(e, {}).get(str(g), {}).values()) for g in plan.top_gs])
            report.mean_line(ax, e, k, xs, stat[:, 0], np.nan_to_num(stat[:, 1]), np.arange(len(xs)), xs, 1.0)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(g) for g in plan.top_gs])
        ax.set_title(f"{name}: {reg['frac_train_below_0.05']:.2f} below 0.05", fontsize=10)
        ax.set_xlabel("G (128 responses per step)" if data["responses_per_step"] == 128 else "G")
    report.finish(fig, axes, "final held-out pass@1", "Mean over seeds, 95% t-intervals.", source, out / "regimes.png")
    fig, axes = report.panels(len(regs))
    for ax, (name, reg) in zip(axes[0], regs.items(), strict=True):
        ax.axhline(0.0, **report.REFERENCE)
        for k, other in enumerate(EBPO_AGAINST):
            got = [(int(g), r) for g, recs in reg["pairs"].items() if (r := _pair(recs, "ebpo", other))]
            if not got:
                continue
            x = np.asarray([g for g, _ in got], dtype=float) * 2 ** ((k - 1) * 0.06)
            mean = np.asarray([r["mean"] * (1 if r["a"] == "ebpo" else -1) for _, r in got])
            style = report._style(other, k)
            for half, width, cap, label in (("holm_half", 1.8, 3, f"ebpo - {other}"), ("half", 0.8, 0, None)):
                ax.errorbar(x, mean, yerr=[r[half] for _, r in got], fmt=style["marker"] + "-", color=style["color"],
                            elinewidth=width, capsize=cap, label=label)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(g) for g in plan.top_gs])
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("G")
    note = "Paired by seed; thick bars: Holm-adjusted 95% intervals over the top group's pairs; thin: plain 95%."
    report.finish(fig, axes, "final held-out pass@1 difference", note, source, out / "differences.png")
    fig, axes = plt.subplots(1, len(regs), figsize=(3.8 * len(regs), 3), squeeze=False)
    for ax, (name, reg) in zip(axes[0], regs.items(), strict=True):
        ax.bar(np.arange(10) / 10 + 0.05, reg["pass_rate_histogram"], width=0.09, color="0.4")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("warm-start pass rate of an RL prompt")
    axes[0][0].set_ylabel("RL prompts")
    report._save(fig, out / "histograms.png")
