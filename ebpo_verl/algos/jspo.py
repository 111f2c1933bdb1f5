"""JSPO: the James-Stein shrinkage baseline, per step (torch / numpy, no verl import); the one implementation of
both ``jspo`` and the v2 draft's ``shrinkage_js`` (:func:`ebpo_verl.algos.baselines.compute_js_advantages`).

Zeng et al., "Shrinking the Variance: Shrinkage Baselines for Reinforcement Learning with Verifiable Rewards",
arXiv 2511.03710 (JSPO), the leave-one-out James-Stein baseline. For prompt i of the batch's n prompts, with m_i
responses, mean mu_i and w_i = s_i^2 / m_i (unbiased variance over m_i, 0 for m_i = 1), leaving prompt i out:
mbar_i = mean of the other means, s_i = their population variance (floored at 0), v_i = mean of the other w;
baseline of response j: b_ij = (1 - lambda_i) mu_i^{-j} + lambda_i mbar_i, mu_i^{-j} the leave-one-out mean of
its own group; A_ij = r_ij - b_ij (no std division). The shrinkage weight lambda_i depends on ``form``:

- ``paper``: lambda_i = ((n - 1) / n) v_i / (v_i + s_i), and 0 when v_i + s_i <= 1e-6 (bit-identical to
  ``shrinkage_js``);
- ``authors_code`` (``guanning03/JSPO-Official``): lambda_i = v_i / (v_i + s_i + 1e-6), no (n - 1) / n factor.

Edge cases (both forms unless said): an all-correct or all-wrong group gets lambda_i (r - mbar_i), not 0; one
prompt in the batch (n = 1) gets lambda = 0 and its plain group mean as baseline, A = r - mu (not RLOO's
leave-one-out mean; as the EBPO fork's ``shrinkage_js``; our choice: the formula's means over the other prompts
are empty, the JSPO authors' code would give NaN); a lone response (m_i = 1)
gets lambda_i (r - mbar_i) under ``paper`` (its own mean is its baseline's leave-one-out part) and is refused
under ``authors_code`` (the authors' code requires G >= 2). Padding rows get 0 and enter no statistic; every sum
runs in sorted order, so results do not depend on the order of the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ebpo_verl.algos.estimator import Advantages, Batch
from ebpo_verl.algos.grouping import Groups, scatter_rows, sorted_sum
from ebpo_verl.algos.registry import EstimatorSpec
from ebpo_verl.options.parsing import OptionSection, option

EPS = 1e-6
"""The papers' and the authors' code's fixed epsilon."""
FORMS = ("paper", "authors_code")


@dataclass(frozen=True)
class JSPOOptions(OptionSection):
    """Options of the ``jspo`` estimator (``algorithm.jspo.<key>``)."""

    SECTION: ClassVar[str] = "algorithm.jspo"

    form: str = option(
        "paper",
        "paper: lambda = ((n-1)/n) v / (v + s), 0 when v + s <= 1e-6 (arXiv 2511.03710; = shrinkage_js); "
        "authors_code: lambda = v / (v + s + 1e-6) and every group needs G >= 2 (guanning03/JSPO-Official)",
        choices=FORMS,
    )


def leave_one_out_parts(g: Groups) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mbar, v, s, mu_own) of n >= 2 prompts: leave-one-prompt-out mean of the means, mean of w = var / m and
    population variance of the means (floored at 0), and each row's leave-one-out mean of its own group."""
    n = len(g.keys)
    w = g.var / g.size
    # leave-one-out sums on means shifted by their average (the variance is shift-invariant; less cancellation)
    shift = sorted_sum(g.mean) / n
    c = g.mean - shift
    others = (sorted_sum(c) - c) / (n - 1)  # mbar_i - shift
    mbar = shift + others
    s = ((sorted_sum(c * c) - c * c) - (n - 1) * others * others) / (n - 1)
    s = s.clamp_min(0.0)
    v = (sorted_sum(w) - w) / (n - 1)
    m_row = g.size.index_select(0, g.row_group)
    mu_row = g.mean.index_select(0, g.row_group)
    loo = (m_row * mu_row - g.r) / (m_row - 1).clamp_min(1.0)
    return mbar, v, s, torch.where(m_row > 1, loo, mu_row)


def compute_jspo_advantages(batch: Batch, options: JSPOOptions) -> Advantages:
    """JSPO advantages A_ij = r_ij - [(1 - lambda_i) mu_i^{-j} + lambda_i mbar_i] (arXiv 2511.03710, Sec. 3; the
    module doc), shape ``(bs,)``, the rows grouped by uid (``row_values`` not read); padding rows get 0;
    diagnostic ``jspo/lambda_mean`` (0 when empty)."""
    g = batch.uid_groups()
    n = len(g.keys)
    if n == 0:
        return Advantages(scatter_rows(batch.scores, g, g.r), {})
    if options.form == "authors_code" and bool((g.size < 2).any()):
        lone = g.keys[(g.size < 2).numpy()].tolist()
        raise ValueError(
            f"jspo form=authors_code needs at least 2 responses per prompt (the authors' code requires G >= 2); "
            f"uid(s) {lone[:20]} have one: set actor_rollout_ref.rollout.n >= 2 or use algorithm.jspo.form=paper"
        )
    if n == 1:
        lam = torch.zeros(1, dtype=torch.float64)
        mbar = g.mean
        mu_own = g.mean.index_select(0, g.row_group)
    else:
        mbar, v, s, mu_own = leave_one_out_parts(g)
        if options.form == "authors_code":  # lambda_i of the form (module doc)
            lam = v / (v + s + EPS)
        else:
            total = v + s
            lam = torch.where(total > EPS, ((n - 1) / n) * v / total.clamp_min(EPS), torch.zeros_like(total))
    lam_row = lam.index_select(0, g.row_group)
    baseline = (1.0 - lam_row) * mu_own + lam_row * mbar.index_select(0, g.row_group)
    diagnostics = {"jspo/lambda_mean": (sorted_sum(lam) / n).item()}
    return Advantages(scatter_rows(batch.scores, g, g.r - baseline), diagnostics)


SPECS = (
    EstimatorSpec(
        "jspo", "James-Stein shrinkage baseline: leave-one-out group mean shrunk toward the other prompts' mean",
        "arXiv 2511.03710 (JSPO); authors' code guanning03/JSPO-Official",
        compute=compute_jspo_advantages, options_cls=JSPOOptions,
        min_group=lambda options: "form=authors_code requires G >= 2" if options.form == "authors_code" else None,
    ),
)  # fmt: skip
