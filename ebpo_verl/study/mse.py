"""Beta-Bernoulli check of the paper's MSE theorem.

Prompt difficulty theta_q ~ Beta(a, b); G responses with rewards r ~ Bernoulli(theta_q). With mu = E[theta],
tau^2 = Var(theta) and sigma^2 = E[theta (1 - theta)] (the expected within-prompt variance), the shrinkage
S = (sigma^2 / G) / (sigma^2 / G + tau^2) and the baseline V_q = (1 - S) mean_q + S mu satisfy

    MSE(V_q) / MSE(mean_q) = 1 - S       (MSE(mean_q) = sigma^2 / G; the cross term vanishes).

The simulation reports the empirical ratio next to 1 - S; with a Beta prior V_q is the posterior mean (conjugacy),
so 1 - S is the smallest ratio any baseline reaches. The same stream also goes through the real estimator
(``compute_ebpo_advantages``, ``norm="none"``: V_q = r - A) with its running statistics, whose S is estimated
from the data (and so misses the optimum in a direction that depends on the options).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ebpo_verl.algos.ebpo import EBPOOptions
from ebpo_verl.algos.ebpo_math import compute_ebpo_advantages
from ebpo_verl.algos.ebpo_state import EBPOState
from ebpo_verl.algos.estimator import Batch
from ebpo_verl.ops.atomic import atomic_write_text
from ebpo_verl.study.report import md_table

DISTRIBUTIONS: dict[str, tuple[float, float]] = {
    "uniform Beta(1,1)": (1.0, 1.0),
    "hard Beta(0.5,3)": (0.5, 3.0),
    "U-shaped Beta(0.3,0.3)": (0.3, 0.3),
    "concentrated Beta(8,8)": (8.0, 8.0),
    "easy Beta(3,1)": (3.0, 1.0),
}
GROUP_SIZES = (2, 4, 8, 16)
ESTIMATOR_VARIANTS = {
    "ebpo default (total sigma^2, raw tau^2)": {},
    "ebpo debiased tau^2": {"tau2": "debiased"},
    "ebpo within sigma^2": {"sigma2": "within"},
}


def beta_moments(a: float, b: float) -> tuple[float, float, float]:
    """(mu, tau^2, sigma^2) of theta ~ Beta(a, b): mean, variance, and E[theta (1 - theta)] = mu - tau^2 - mu^2."""
    mu = a / (a + b)
    tau2 = a * b / ((a + b) ** 2 * (a + b + 1))
    return mu, tau2, mu - tau2 - mu**2


def simulate(a: float, b: float, g: int, n_prompts: int, seed: int) -> dict[str, float]:
    """Empirical MSE ratio of the population-prior EB baseline over the sample mean, and 1 - S."""
    rng = np.random.default_rng(seed)
    theta = rng.beta(a, b, n_prompts)
    mean_q = rng.binomial(g, theta) / g
    mu, tau2, sigma2 = beta_moments(a, b)
    s = (sigma2 / g) / (sigma2 / g + tau2)
    v = (1 - s) * mean_q + s * mu
    return {
        "S": s,
        "closed_form": 1 - s,
        "empirical": float(np.mean((v - theta) ** 2) / np.mean((mean_q - theta) ** 2)),
    }


def estimator_ratio(
    a: float, b: float, g: int, batches: int, prompts_per_batch: int, seed: int, options: dict
) -> tuple[float, float]:
    """MSE ratio of the real estimator's baseline (merged history statistics) over the sample mean across ``batches``
    batches (the first excluded), with its Monte Carlo standard error (delta method over prompts)."""
    rng = np.random.default_rng(seed)
    opts = EBPOOptions.from_mapping({**options, "norm": "none"})
    state = EBPOState()
    err_v, err_mean = [], []
    for step in range(batches):
        theta = rng.beta(a, b, prompts_per_batch)
        rewards = (rng.random((prompts_per_batch, g)) < theta[:, None]).astype(np.float64)
        scores = torch.from_numpy(rewards.reshape(-1))
        index = np.repeat([f"{step}-{i}" for i in range(prompts_per_batch)], g)
        adv = compute_ebpo_advantages(
            Batch(scores, index, torch.ones(len(scores), dtype=torch.bool)), opts, state
        ).values
        baseline = (scores - adv).numpy().reshape(prompts_per_batch, g)[:, 0]
        if step > 0:
            err_v.append((baseline - theta) ** 2)
            err_mean.append((rewards.mean(axis=1) - theta) ** 2)
    ev, em = np.concatenate(err_v), np.concatenate(err_mean)
    ratio = float(ev.mean() / em.mean())
    return ratio, float(np.std(ev - ratio * em, ddof=1) / np.sqrt(len(ev)) / em.mean())


def findings(rows: list[dict]) -> str:
    """What the estimator columns show, counted from the rows: ratios above 1 and below the optimum 1 - S."""
    est = list(ESTIMATOR_VARIANTS)
    above = [(e, r) for r in rows for e in est if r[e] > 1]
    below = [(e, r) for r in rows for e in est if r[e] < r["closed_form"]]

    def where(pairs: list[tuple[str, dict]]) -> str:
        """The cells grouped by estimator, then distribution: ``est: dist G=2, 4, other G=8; est2: ...``."""
        grouped: dict[str, dict[str, list[int]]] = {}
        for e, r in pairs:
            grouped.setdefault(e, {}).setdefault(r["distribution"], []).append(r["G"])
        return "; ".join(
            f"{e}: " + ", ".join(f"{d} G={', '.join(map(str, gs))}" for d, gs in by_dist.items())
            for e, by_dist in grouped.items()
        )

    text = (
        f"In {len(rows) * len(est) - len(above) - len(below)} of the {len(rows) * len(est)} estimator cells the ratio "
        "lies between the optimum 1 - S and 1 (the estimated S misses the optimum but still beats the group mean)."
    )
    if above:
        text += f" It is above 1, worse than the group mean, in {len(above)} ({where(above)})."
    if below:
        z = max((r["closed_form"] - r[e]) / r[e + " se"] for e, r in below)
        text += (
            f" It is below 1 - S in {len(below)} ({where(below)}), by at most {z:.1f} standard errors: Monte Carlo "
            "noise of the estimator's shorter stream, since no baseline beats the posterior mean in expectation."
        )
    return text


def run_mse_study(
    out: Path, command: str, n_prompts: int = 400_000, batches: int = 40, prompts_per_batch: int = 256, seed: int = 0
) -> str:
    """Write ``mse.md`` into ``out`` and return its table: per distribution and G, :func:`simulate` with
    ``n_prompts`` prompts and :func:`estimator_ratio` of every :data:`ESTIMATOR_VARIANTS` over ``batches``."""
    rows, est = [], list(ESTIMATOR_VARIANTS)
    for k, (name, (a, b)) in enumerate(DISTRIBUTIONS.items()):
        for g in GROUP_SIZES:
            row = {"distribution": name, "G": g, **simulate(a, b, g, n_prompts, seed + 100 * k + g)}
            for label, opts in ESTIMATOR_VARIANTS.items():
                ratio = estimator_ratio(a, b, g, batches, prompts_per_batch, seed + 100 * k + g, opts)
                row[label], row[label + " se"] = ratio
            rows.append(row)
    head = ["difficulty distribution", "G", "S", "closed form 1-S", "empirical MSE ratio", "rel. error", *est]
    text = md_table(head, [
        [r["distribution"], str(r["G"]), f"{r['S']:.3f}", f"{r['closed_form']:.4f}", f"{r['empirical']:.4f}",
         f"{100 * (r['empirical'] / r['closed_form'] - 1):+.2f}%", *(f"{r[e]:.4f} ({r[e + ' se']:.4f})" for e in est)]
        for r in rows
    ])  # fmt: skip
    n = (batches - 1) * prompts_per_batch
    doc = f"""# Beta-Bernoulli check of the MSE theorem

Command: `{command}`

MSE of a baseline as an estimate of the true pass rate theta_q, divided by the MSE of the group mean.
"closed form" is 1 - S with S computed from the simulation's true sigma^2 = E[theta(1-theta)] and tau^2 =
Var(theta); "empirical" is the shrinkage baseline with these population values (mu, S), simulated. With a Beta
prior that baseline is the posterior mean, so 1 - S is the best ratio any baseline can reach.

The last three columns run a stream of {n:,} prompts (in batches, the first batch excluded) through the
package's estimator (`compute_ebpo_advantages`, history statistics merged before use), whose S comes from its
running estimates; the Monte Carlo standard error of each ratio is in brackets. "ebpo default" uses the total
reward variance as sigma^2 (it counts tau^2 as noise) and the raw between-prompt variance as tau^2 (it includes
the sampling noise sigma^2/G): the first makes S too large where prompts differ a lot (U-shaped), the second
too small where they differ little (concentrated). "ebpo debiased tau^2" (`tau2=debiased`) subtracts the
sampling noise, sigma^2 mean(1/G) with the same total sigma^2, from tau^2 (floored at 0): near the optimum
where tau^2 is small, but with the total sigma^2 it over-corrects where tau^2 is large (U-shaped: far above 1).
"ebpo within sigma^2" (`sigma2=within`) uses the within-prompt variance with the raw tau^2 (S too small, most
where tau^2 is small).

{findings(rows)}

{text}
"""
    atomic_write_text(out / "mse.md", doc)
    return text
