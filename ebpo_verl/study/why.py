"""Why running norms win here (issue 52): a pre-registered shrinkage dose-response, a memory test sized to detect
0.004, warm starts as a random effect, per-prompt pass rates. The plan, its predictions and its primary tests:
``docs/study_why_PLAN.md`` (committed before the first run).

``python -m ebpo_verl.study --preset why --out DIR`` saves each run when it ends (:func:`runner.run_grid`); a rerun
recomputes every decision (rate choices, grid extensions, the memory cells' seed counts) from the saved runs, so it
resumes. A cell's tuning runs on its mix's warm start ``w0``; a warm start's runs live in ``DIR/<mix>-w<k>/``."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from scipy import stats

from ebpo_verl.ops.atomic import atomic_write, atomic_write_text
from ebpo_verl.study import report, runner
from ebpo_verl.study.presets import PRESETS, Preset, TunedPlan
from ebpo_verl.study.report import SIDES, side
from ebpo_verl.study.rivals2 import ALPHA, REGIMES, extensions, holm, lr_choice, mde, pairs
from ebpo_verl.study.rl import RLConfig
from ebpo_verl.study.why_page import closing_note, dose_figure, page

FIXED_S = {"grpo_bn": 0.0, "ebpo_s025": 0.25, "ebpo_s05": 0.5, "ebpo_s075": 0.75, "ebpo_s1": 1.0}
"""The dose-response's fixed-shrinkage arms and their S."""
DOSE_ARMS = ("grpo", *FIXED_S, "ebpo", "ebpo_debiased", "ebpo_glob", "running_norm")
MEMORY_ARMS = ("ebpo", "ebpo_batch", "ebpo_decay095")
WARM_ARMS = ("grpo", "ebpo", "ebpo_batch", "running_norm")
MIXES = {r.name: r for r in REGIMES if r.name in ("current", "hard")}
RIVALS2_RATES = {
    ("current", 2): {"grpo": 1.5e-4, "ebpo": 3e-4, "ebpo_batch": 3e-4, "running_norm": 3e-4},
    ("hard", 2): {"grpo": 7.5e-5, "ebpo": 1.5e-4, "running_norm": 1.5e-4},
}
"""Rates rivals2 tuned at these (mix, G) with 128 responses a step (docs/study_rivals2/summary.json, lr_used)."""
STABILITY = ("shrinkage", "grad_norm", "step_kl", "entropy", "zero_signal")
"""Per-step metrics the page reports per arm (the paper's stability claims; mean S a step)."""


@dataclass(frozen=True)
class Cell:
    """A block of the study: ``arms`` at G = ``group_size`` with ``responses`` a step on mix ``mix``, on each warm
    start of ``warm_starts``, test seeds ``seed0 ..``: ``seeds`` of them, or (``max_seeds`` set) a pilot of ``seeds``
    then the memory rule's n. ``reused``: {arm: rate} from rivals2; every other arm is tuned on ``w0``."""

    name: str
    mix: str
    group_size: int
    arms: tuple[str, ...]
    responses: int = 128
    warm_starts: tuple[int, ...] = (0,)
    seeds: int = 16
    max_seeds: int | None = None
    reused: dict = field(default_factory=dict)

    def slot(self, arm: str) -> tuple[str, int, int, str]:
        """The tuning slot of ``arm`` (shared by cells with the same mix, G and responses)."""
        return (self.mix, self.group_size, self.responses, arm)


@dataclass(frozen=True)
class WhyPlan(TunedPlan):
    """The study: ``scale`` (a preset) gives the RL run, splits and warm starts; ``cells`` run in order. Tuning: each
    rate of ``lr_grid`` on ``tune_seeds`` seeds from ``tune_seed0`` (validation split), a choice at the grid's edge
    extended (x2 or /2) at most ``max_extensions`` times while the study stays within ``run_cap`` runs. Memory cells
    size their seeds to detect ``mde_target``."""

    name: str
    scale: Preset
    cells: tuple[Cell, ...]
    seed0: int = 200
    tune_seed0: int = 2000
    tune_seeds: int = 4
    lr_grid: tuple[float, ...] = (7.5e-5, 1.5e-4, 3e-4)
    max_extensions: int = 1
    run_cap: int = 1500
    mde_target: float = 0.004

    def arms(self) -> tuple[str, ...]:
        return tuple(sorted({a for c in self.cells for a in c.arms}))

    def problem(self) -> str | None:
        if self.seed0 < 16 or self.tune_seed0 < self.seed0 + max(c.max_seeds or c.seeds for c in self.cells):
            return "test seeds must start at 16 or later and end before the tuning seeds"
        where = {}
        for c in self.cells:  # a run's file is named by arm, G and seed: one responses count per (mix, G)
            if where.setdefault((c.mix, c.group_size), c.responses) != c.responses:
                return f"cells at {c.mix} G={c.group_size} differ in responses a step"
        return None

    def preset(self, cell: Cell) -> Preset:
        mix = MIXES[cell.mix]
        return replace(self.scale, name=f"{self.name}/{cell.name}", topics=mix.topics, levels=mix.levels,
                       misconception=mix.misconception, estimators=cell.arms, group_sizes=(cell.group_size,),
                       order_estimators=(), lr={}, lr_grid={}, tune=None)  # fmt: skip

    def config(self, cell: Cell, arm: str, seed: int, lr: float, split: str = "test") -> RLConfig:
        rl = {**self.scale.rl, "responses_per_step": cell.responses}
        return RLConfig(estimator=arm, group_size=cell.group_size, seed=seed, lr=lr, split=split, **rl)

    def tuned_slots(self) -> list[tuple[str, int, int, str]]:
        """Every slot tuned here, once, in cell order."""
        slots = [c.slot(a) for c in self.cells for a in c.arms if a not in c.reused]
        return list(dict.fromkeys(slots))

    def planned_runs(self) -> int:
        """Tuning on the initial grid plus every test run at the seed caps, each distinct run once."""
        test = {(c.mix, w, c.group_size, a, s) for c in self.cells for w in c.warm_starts for a in c.arms
                for s in range(self.seed0, self.seed0 + (c.max_seeds or c.seeds))}  # fmt: skip
        return len(self.tuned_slots()) * len(self.lr_grid) * self.tune_seeds + len(test)


def _why_cells(seeds: int, pilot: int, caps: tuple[int, int], memory_responses: int) -> tuple[Cell, ...]:
    """The plan page's cells, in its order: ``seeds`` a dose cell, ``pilot`` a memory pilot and a warm start."""
    return (
        Cell("dose_current_g2", "current", 2, DOSE_ARMS, seeds=seeds, reused=RIVALS2_RATES["current", 2]),
        Cell("dose_hard_g2", "hard", 2, DOSE_ARMS, seeds=seeds, reused=RIVALS2_RATES["hard", 2]),
        Cell("dose_current_g16", "current", 16, (*DOSE_ARMS, "ebpo_batch", "ebpo_decay095"), seeds=seeds),
        Cell("memory_g16", "current", 16, MEMORY_ARMS, seeds=pilot, max_seeds=caps[0]),
        Cell("memory_g8", "current", 8, MEMORY_ARMS, responses=memory_responses, seeds=pilot, max_seeds=caps[1]),
        Cell(
            "warm_g2",
            "current",
            2,
            WARM_ARMS,
            warm_starts=(0, 1, 2, 3),
            seeds=pilot,
            reused=RIVALS2_RATES["current", 2],
        ),  # fmt: skip
        Cell("warm_g4", "current", 4, WARM_ARMS, warm_starts=(0, 1, 2, 3), seeds=pilot),
    )


PLANS: dict[str, WhyPlan] = {
    # Issue 52's study (docs/study_why_PLAN.md) at the rivals preset's scale.
    "why": WhyPlan(name="why", scale=PRESETS["rivals"], cells=_why_cells(16, 8, (48, 64), 32)),
    # The same code paths in a few minutes: 2 steps of 32 responses (8 at G = 8), 2 rates, 2 seeds (3 at most).
    "why_tiny": WhyPlan(
        name="why_tiny",
        scale=replace(
            PRESETS["tiny"],
            split_sizes={"val": 30, "heldout": 30, "train": 60, "sft": 1000},
            sft_steps=200,
            rl={"steps": 2, "responses_per_step": 32, "eval_every": 1, "grad_clip": 5.0},
        ),
        cells=tuple(replace(c, responses=32 if c.responses == 128 else 8) for c in _why_cells(2, 2, (3, 3), 8)),
        tune_seeds=2,
        lr_grid=(1.5e-4, 3e-4),
        run_cap=1500,
        mde_target=0.5,
    ),
}
DURATION = {
    "why": "about 2 h on 2 idle cores (estimated: 9.7 s a run per process, memory_g8's runs a quarter of that)",
    "why_tiny": "about 2-3 min",
}


# ----------------------------------------------------------------------------------------------- running


def seeds_needed(sd: float, low: int, high: int, target: float) -> int:
    """The smallest n in [low, high] whose paired one-sided test at 0.025 (a two-sided 0.05 one), power 80%,
    detects ``target`` (:func:`rivals2.mde`: (t(0.975, n-1) + t(0.8, n-1)) sd / sqrt(n) <= target); ``high`` where
    none does."""
    for n in range(max(low, 2), high + 1):
        if mde(sd, n) <= target:
            return n
    return high


class _Study:
    """One invocation: the warm starts (loaded or trained once each), the tuned rates, the runs room left."""

    def __init__(self, plan: WhyPlan, out: Path, workers: int | None, train: bool = True):
        self.plan, self.out, self.workers, self.train = plan, out, workers, train
        self.bases: dict[tuple[str, int], runner.Base] = {}
        self.choices: dict[tuple, dict] = {}
        self.room = plan.run_cap - plan.planned_runs()
        self.tuning_runs: list[dict] = []

    def folder(self, mix: str, warm: int) -> Path:
        return self.out / f"{mix}-w{warm}"

    def base(self, cell: Cell, warm: int) -> runner.Base:
        key = (cell.mix, warm)
        if key not in self.bases:
            if self.train:
                self.folder(*key).mkdir(parents=True, exist_ok=True)
            self.bases[key] = runner.prepare_base(self.plan.preset(cell), self.folder(*key), warm, self.train)
        return self.bases[key]

    def run(self, cell: Cell, jobs: list[RLConfig], warm: int = 0) -> list[dict]:
        runs, _ = runner.run_grid(self.plan.preset(cell), self.base(cell, warm), self.folder(cell.mix, warm), jobs,
                                  self.workers, self.train)  # fmt: skip
        if len(runs) < len(jobs) and not self.train and jobs[0].split == "validation":
            raise runner.NotSavedYet(f"{cell.name}: {len(runs)} of {len(jobs)} tuning runs saved")
        return runs

    def tune(self, cell: Cell) -> None:
        """The cell's arms not reused and not tuned before: the grid, then its extensions, on warm start 0."""
        plan, todo = self.plan, [cell.slot(a) for a in cell.arms if a not in cell.reused]
        rates = {s: list(plan.lr_grid) for s in todo if s not in self.choices}
        if not rates:
            return
        while True:
            jobs = [plan.config(cell, s[3], seed, lr, "validation") for s, lrs in rates.items() for lr in lrs
                    for seed in plan.tuning_seeds]  # fmt: skip
            runs = self.run(cell, jobs)
            scores: dict = {}
            for r in runs:
                c = r["config"]
                scores.setdefault(cell.slot(c["estimator"]), {}).setdefault(c["lr"], {})[c["seed"]] = r
            choices = {s: lr_choice({lr: {k: runner.tuning_score(r) for k, r in v.items()}
                                     for lr, v in scores[s].items()}) for s in rates}  # fmt: skip
            add = extensions(choices, rates, plan.lr_grid, plan.max_extensions, self.room, plan.tune_seeds)
            if not add:
                break
            for s, lr in add:
                rates[s].append(lr)
            self.room -= len(add) * plan.tune_seeds
        for s in rates:
            final = {lr: [float(r["metrics"]["accuracy"][-1]) for r in v.values()] for lr, v in scores[s].items()}
            finals = {f"{lr:g}": report.ci_record(v) for lr, v in final.items()}
            self.choices[s] = {**choices[s], "extended": len(rates[s]) - len(plan.lr_grid), "final_validation": finals}
        self.tuning_runs += runs

    def rate(self, cell: Cell, arm: str) -> float:
        return cell.reused[arm] if arm in cell.reused else self.choices[cell.slot(arm)]["chosen"]

    def test(self, cell: Cell) -> dict:
        """The cell's test runs: {warm: {arm: {seed: run}}}, with the memory rule's pilot first where it has one."""
        seeds = list(range(self.plan.seed0, self.plan.seed0 + cell.seeds))
        runs = self._test(cell, seeds)
        if cell.max_seeds:
            a, b = cell.arms[0], cell.arms[1]
            d = [_final(runs[0][a][s]) - _final(runs[0][b][s]) for s in seeds if s in runs[0][a] and s in runs[0][b]]
            if len(d) < len(seeds):
                raise runner.NotSavedYet(f"{cell.name}: the pilot's {len(seeds)} seeds are not all saved")
            n = seeds_needed(float(np.std(d, ddof=1)), cell.seeds, cell.max_seeds, self.plan.mde_target)
            runs = self._test(cell, list(range(self.plan.seed0, self.plan.seed0 + n)))
        return runs

    def _test(self, cell: Cell, seeds: list[int]) -> dict:
        got = {}
        for w in cell.warm_starts:
            jobs = [self.plan.config(cell, a, s, self.rate(cell, a)) for a in cell.arms for s in seeds]
            got[w] = {}
            for r in self.run(cell, jobs, w):
                got[w].setdefault(r["config"]["estimator"], {})[r["config"]["seed"]] = r
        return got


def _final(run: dict) -> float:
    return float(run["metrics"]["accuracy"][-1])


def run_why(plan: WhyPlan, out: Path, command: str, workers: int | None = None, study_dir: Path | None = None) -> str:
    """Every cell in order (tuning, then test runs), then ``summary.json``, ``per_prompt.npz``, ``study.md`` and
    ``dose.png`` in ``out``; returns the page's closing note. With ``study_dir`` (a report): nothing is trained or
    written there; the cells whose tuning (and pilot) it has saved, with the test runs saved so far."""
    t0 = time.perf_counter()
    study, cells = _Study(plan, study_dir or out, workers, train=study_dir is None), {}
    for cell in plan.cells:
        try:
            study.tune(cell)
            cells[cell.name] = study.test(cell)
        except runner.NotSavedYet:
            if study.train:
                raise
            break
    if not cells:
        raise runner.NotSavedYet(f"{study.out}: no cell's tuning is saved yet; nothing to report")
    plan = study.plan = replace(plan, cells=tuple(c for c in plan.cells if c.name in cells))
    infos = {f"{m}-w{w}": runner.describe_base(b) for (m, w), b in study.bases.items()}
    data = summarize(plan, study, cells, infos, command, time.perf_counter() - t0)
    write_per_prompt(out / "per_prompt.npz", study, cells)
    dose_figure(out / "dose.png", data)
    atomic_write_text(out / "summary.json", json.dumps(data, indent=1) + "\n")
    atomic_write_text(out / "study.md", page(data))
    return closing_note(data)


# ----------------------------------------------------------------------------------------------- statistics


def test_record(x, alternative: str = "two-sided", **labels) -> dict:
    """The t-test of ``x`` against 0: n, mean, sd, the plain 95% half-width (two-sided) or one-sided bound width
    (``greater``), p."""
    x = np.asarray(x, dtype=float)
    n, mean = len(x), float(x.mean())
    sd = float(x.std(ddof=1)) if n > 1 else math.nan
    se = sd / math.sqrt(n) if n > 1 else math.nan
    if n < 2 or not se > 0:
        p = 1.0 if n < 2 or mean == 0 or (alternative == "greater" and mean < 0) else 0.0
    else:
        p = float(stats.ttest_1samp(x, 0.0, alternative=alternative).pvalue)
    q = 1 - ALPHA if alternative == "greater" else 1 - ALPHA / 2
    half = float(stats.t.ppf(q, n - 1) * se) if n > 1 else math.nan
    return {**labels, "alternative": alternative, "n": n, "mean": mean, "sd": sd, "half": half, "p": p}


def verdict(mean: float, half: float, alternative: str) -> str:
    if not np.isfinite(half):
        return SIDES[2]
    if alternative == "greater":
        return SIDES[0] if mean - half > 0 else SIDES[2]
    return side(mean, half)


def family(records: list[dict]) -> list[dict]:
    """Holm over ``records`` (:func:`rivals2.holm`): adjusted p, the interval level and half-width, both verdicts."""
    adjusted, levels = holm([r["p"] for r in records])
    for r, adj, level in zip(records, adjusted, levels, strict=True):
        q = 1 - level if r["alternative"] == "greater" else 1 - level / 2
        se = r["sd"] / math.sqrt(r["n"]) if r["n"] > 1 else math.nan
        r["p_holm"], r["holm_level"] = adj, level
        r["holm_half"] = float(stats.t.ppf(q, r["n"] - 1) * se) if r["n"] > 1 else math.nan
        r["plain"] = verdict(r["mean"], r["half"], r["alternative"])
        r["holm"] = verdict(r["mean"], r["holm_half"], r["alternative"])
    return records


def by_seed(cell_runs: dict, warm: int = 0) -> dict[str, dict[int, float]]:
    return {a: {s: _final(r) for s, r in seeds.items()} for a, seeds in cell_runs.get(warm, {}).items()}


def diff(final: dict, a: str, b: str) -> list[float]:
    return [final[a][s] - final[b][s] for s in sorted(set(final.get(a, {})) & set(final.get(b, {})))]


def slopes(final: dict) -> list[float]:
    """Each seed's least-squares slope of final accuracy on S over the :data:`FIXED_S` arms."""
    seeds = sorted(set.intersection(*(set(final.get(a, {})) for a in FIXED_S)))
    s = np.asarray(list(FIXED_S.values()))
    return [float(np.polyfit(s, [final[a][k] for a in FIXED_S], 1)[0]) for k in seeds]


def best_fixed(study_choices: dict, cell: Cell) -> str:
    """The fixed-S arm with the highest tuning score at its chosen rate (tuning seeds only)."""

    def score(arm: str) -> float:
        c = study_choices[cell.slot(arm)]
        return c["validation"][c["values"].index(c["chosen"])][0]

    return max(FIXED_S, key=lambda a: (score(a), -FIXED_S[a]))


def dose_family(plan: WhyPlan, choices: dict, cells: dict) -> list[dict]:
    recs = []
    for cell in (c for c in plan.cells if c.name.startswith("dose")):
        final, best = by_seed(cells[cell.name]), best_fixed(choices, cell)
        recs += [
            test_record(slopes(final), test="trend", cell=cell.name, a="S", b="accuracy"),
            test_record(
                diff(final, best, "running_norm"), test="best_fixed", cell=cell.name, a=best, b="running_norm"
            ),  # fmt: skip
            test_record(
                diff(final, "ebpo_debiased", "ebpo"), test="debiased", cell=cell.name, a="ebpo_debiased", b="ebpo"
            ),  # fmt: skip
            test_record(diff(final, "ebpo_glob", "ebpo_s1"), test="glob", cell=cell.name, a="ebpo_glob", b="ebpo_s1"),
        ]
    return family(recs)


def memory_family(plan: WhyPlan, cells: dict) -> list[dict]:
    recs = []
    for cell in (c for c in plan.cells if c.max_seeds):
        final = by_seed(cells[cell.name])
        r = test_record(diff(final, "ebpo", "ebpo_batch"), "greater", test="memory", cell=cell.name, a="ebpo",
                        b="ebpo_batch")  # fmt: skip
        r["mde"] = mde(r["sd"], r["n"]) if r["n"] > 1 else math.nan
        r["decay"] = test_record(diff(final, "ebpo_decay095", "ebpo_batch"), a="ebpo_decay095", b="ebpo_batch")
        recs.append(r)
    return family(recs)


def warm_family(plan: WhyPlan, cells: dict) -> list[dict]:
    """ebpo - X per warm start (plain paired records) and across them (t over the warm starts' mean differences)."""
    recs = []
    for cell in (c for c in plan.cells if len(c.warm_starts) > 1):
        for other in ("grpo", "ebpo_batch", "running_norm"):
            per = {w: test_record(diff(by_seed(cells[cell.name], w), "ebpo", other), warm=w) for w in cell.warm_starts}
            done = [r["mean"] for r in per.values() if r["n"] > 0]
            rec = test_record(done, test="warm", cell=cell.name, a="ebpo", b=other) if done else None
            if rec is None:
                continue
            for r in per.values():
                r["plain"] = verdict(r["mean"], r["half"], "two-sided")
            rec["per_warm"] = {str(w): r for w, r in per.items()}
            rec["changes"] = len({r["plain"] for r in per.values() if r["n"] > 1}) > 1
            recs.append(rec)
    return family(recs)


def stability(cell_runs: dict) -> dict[str, dict[str, float]]:
    """Per arm (warm start 0): each :data:`STABILITY` metric's mean over steps and seeds, the gradient norm's std
    over steps (mean over seeds) and the final entropy."""
    out = {}
    for arm, seeds in cell_runs.get(0, {}).items():
        ms = [r["metrics"] for r in seeds.values()]
        rec = {k: float(np.mean([np.mean(m[k]) for m in ms if len(m.get(k, ()))])) for k in STABILITY
               if any(len(m.get(k, ())) for m in ms)}  # fmt: skip
        rec["grad_norm_std"] = float(np.mean([np.std(m["grad_norm"]) for m in ms]))
        rec["final_entropy"] = float(np.mean([m["entropy"][-1] for m in ms]))
        out[arm] = rec
    return out


def stratified(cell_runs: dict, start: np.ndarray, low: float = 0.05) -> dict[str, dict[str, dict]]:
    """Per arm, its gain over ``grpo`` (paired by seed) in the mean end - start pass rate of the trained prompts it
    saw, separately where the warm start's pass rate is below ``low`` and at or above it."""

    def gains(run: dict) -> dict[str, float]:
        end, seen = np.asarray(run["metrics"]["train_pass_final"]), np.asarray(run["metrics"]["train_seen"]) > 0
        g = end - start
        return {"below": float(g[seen & (start < low)].mean()), "above": float(g[seen & (start >= low)].mean())}

    per = {a: {s: gains(r) for s, r in seeds.items()} for a, seeds in cell_runs.get(0, {}).items()}
    return {
        a: {k: test_record(diff({a: {s: v[k] for s, v in per[a].items()},
                                 "grpo": {s: v[k] for s, v in per["grpo"].items()}}, a, "grpo"))
            for k in ("below", "above")}
        for a in per if a != "grpo" and "grpo" in per
    }  # fmt: skip


def summarize(plan: WhyPlan, study: _Study, cells: dict, infos: dict, command: str, seconds: float) -> dict:
    """summary.json: the plan, the tuning, every final accuracy by warm start and seed, the three families, the
    stability metrics, the stratified gains and the wall time."""
    finals = {c.name: {str(w): by_seed(cells[c.name], w) for w in c.warm_starts} for c in plan.cells}
    test_runs = {(r["config"]["estimator"], c.group_size, c.mix, w, s): r for c in plan.cells
                 for w, arms in cells[c.name].items() for seeds in arms.values() for s, r in seeds.items()}  # fmt: skip
    secondary = {c.name: pairs(by_seed(cells[c.name]), c.arms) for c in plan.cells if c.name.startswith("dose")}
    return {
        "plan": plan.name,
        "command": command,
        "wall_seconds": round(seconds, 1),
        "run_seconds": round(
            sum(i["sft_seconds"] for i in infos.values())
            + sum(r["seconds"] for r in (*study.tuning_runs, *test_runs.values())),
            1,
        ),  # fmt: skip
        "n_runs": {"tuning": len(study.tuning_runs), "test": len(test_runs), "cap": plan.run_cap},
        "workers": plan.scale.workers,
        "steps": plan.scale.rl["steps"],
        "cells": {
            c.name: {
                **asdict(c),
                "seeds_run": sorted({s for a in finals[c.name]["0"].values() for s in a}),
                "rates": {a: study.rate(c, a) for a in c.arms},
            }
            for c in plan.cells
        },  # fmt: skip
        "fixed_s": FIXED_S,
        "tuning": {"/".join(map(str, s)): ch for s, ch in study.choices.items()},
        "tuning_seeds": plan.tuning_seeds,
        "warm_starts": {k: {x: v for x, v in i.items() if x != "heldout_pass"} for k, i in infos.items()},
        "final": finals,
        "families": {
            "dose": dose_family(plan, study.choices, cells),
            "memory": memory_family(plan, cells),
            "warm": warm_family(plan, cells),
        },  # fmt: skip
        "secondary_pairs": secondary,
        "stability": {c.name: stability(cells[c.name]) for c in plan.cells if c.name.startswith("dose")},
        "stratified": {
            c.name: stratified(cells[c.name], study.bases[c.mix, 0].train_pass)
            for c in plan.cells
            if c.group_size == 2 and c.name.startswith("dose")
        },  # fmt: skip
        "provenance": report.provenance(
            seed={"tuning": plan.tuning_seeds, "test0": plan.seed0}, command=command, started=time.time() - seconds
        ),  # fmt: skip
    }


def write_per_prompt(path: Path, study: _Study, cells: dict) -> None:
    """``per_prompt.npz``: per warm start ``<mix>-w<k>``: ``train_start``/``heldout_start`` (float16 pass rates), and
    over its test runs (each once) ``runs`` (JSON: arm, G, seed), ``train_end``, ``heldout_end`` (float16) and
    ``seen`` (the trained prompts each run saw, packed bits)."""
    arrays = {}
    for (mix, w), base in study.bases.items():
        runs = {}
        for c in (c for c in study.plan.cells if c.mix == mix and w in c.warm_starts):
            for arm, seeds in cells[c.name][w].items():
                for s, r in seeds.items():
                    runs[arm, c.group_size, s] = r
        key, order = f"{mix}-w{w}", sorted(runs)
        if not order:  # a report whose cell on this warm start has no test run saved yet
            continue
        arrays[f"{key}/train_start"] = base.train_pass.astype(np.float16)
        arrays[f"{key}/heldout_start"] = base.heldout_pass.astype(np.float16)
        arrays[f"{key}/runs"] = np.asarray(json.dumps([list(k) for k in order]))
        m = [runs[k]["metrics"] for k in order]
        arrays[f"{key}/train_end"] = np.asarray([x["train_pass_final"] for x in m], dtype=np.float16)
        arrays[f"{key}/heldout_end"] = np.asarray([x["heldout_pass_final"] for x in m], dtype=np.float16)
        arrays[f"{key}/seen"] = np.packbits(np.asarray([x["train_seen"] for x in m]) > 0, axis=1)

    def save(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a path
            np.savez_compressed(f, **arrays)

    atomic_write(path, save)
