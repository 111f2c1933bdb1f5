"""The v2 draft's other baselines: James-Stein shrinkage, BNPO and SPO (torch / numpy, no verl import).

Formulas as the authors' fork implements them (``docs/paper_notes.md#fork-baselines``); the
verl-registered wrappers are in :mod:`ebpo_verl.trainer.adapter` under the fork's names ``shrinkage_js``, ``bnpo``
and ``spo``. Responses are grouped by prompt uid (``shrinkage_js``, ``bnpo``) or by a stable prompt key
(``spo``); padding rows (``valid`` False) get advantage 0 and enter no statistic. Every sum runs over values in
sorted order, so results do not depend on the order of the rows.

- ``shrinkage_js`` (Zeng et al., "Shrinking the Variance", arXiv 2511.03710): ``jspo``'s ``form=paper``
  (:mod:`ebpo_verl.algos.jspo` spells it out); a lone response gets lambda_i (r - mbar_i), the fork's code 0.
- ``bnpo`` (Xiao et al., "BNPO: Beta Normalization Policy Optimization", arXiv 2506.02864): p_q = group mean;
  over the batch's prompts mean_p and unbiased var_p (0 for one prompt); m = clamp(mean_p, eps, 1-eps); when
  eps < var_p < m(1-m): nu = m(1-m)/var_p - 1, a = nu m, b = nu (1-m), else a = b = 0; alpha = 1 + a/3,
  beta = 1 + b/3; A = (r - p_q) / max(eps, Beta(alpha, beta) pdf at clamp(p_q, eps, 1-eps)); eps = 1e-6
  (rewards: :func:`compute_bnpo_advantages`).
- ``spo`` (Xu & Ding, "Single-stream Policy Optimization", arXiv 2509.13232, as simplified in the fork): a
  per-prompt Beta(alpha, beta) tracker keyed by a STABLE prompt key (the fork keys it by verl's per-step uid,
  so no prompt is ever seen twice). A prompt's baseline is alpha / (alpha + beta), 0.5 while unseen; the
  advantage uses the baseline from before this step's update: A = r - baseline, then (A - mean) / (std + eps)
  over the batch (unbiased std). Update, once per step per prompt in the batch, with rbar = the prompt's mean
  reward of this step clamped to [0, 1]: a prompt's first update starts from (alpha, beta) = (n0/2, n0/2) =
  (4, 4), every update is alpha <- rho alpha + rbar, beta <- rho beta + (1 - rbar). So after its first step a
  prompt holds (3.6 + rbar, 4.6 - rbar) with rho = 0.9 (exactly the fork's tracker); prompts absent from a
  batch are not decayed. The tracker assumes rewards in [0, 1]; with +-1 rewards the clamp maps a mean reward
  2p - 1 to max(0, 2p - 1), as the fork does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ebpo_verl.algos.estimator import Advantages, Batch
from ebpo_verl.algos.grouping import pass_levels, scatter_rows, sorted_sum, standardise
from ebpo_verl.algos.jspo import JSPOOptions, compute_jspo_advantages
from ebpo_verl.algos.registry import EstimatorSpec, StateSpec, always
from ebpo_verl.algos.state_codec import MAX_COUNT
from ebpo_verl.algos.tracker import PromptTracker, prompt_groups, prompt_key_option
from ebpo_verl.options.parsing import OptionSection, option, reals, resume_option

EPS = 1e-6
"""The fork's fixed epsilon of ``shrinkage_js`` and ``bnpo``."""


# ------------------------------------------------------------------------------------- shrinkage_js


def compute_js_advantages(batch: Batch) -> Advantages:
    """James-Stein (leave-one-out) shrinkage advantages of ``batch``'s rows grouped by uid (``row_values`` not
    read), shape ``(bs,)``; padding rows get 0; no diagnostics: the ``jspo`` estimator's ``form=paper``
    (:func:`ebpo_verl.algos.jspo.compute_jspo_advantages`, the one implementation)."""
    return Advantages(compute_jspo_advantages(batch, JSPOOptions(form="paper")).values, {})


# ---------------------------------------------------------------------------------------------- bnpo


BNPO_REFUSAL = (
    "bnpo needs rewards in [0, 1] (pass rates: it fits a Beta distribution to the group means) or the paper's "
    "two-level -1/+1 reward, but this batch has reward values {values}{more} (uid(s) {keys}). Such values come "
    "from a shaped or rescaled reward: algorithm.use_kl_in_reward=True subtracts a KL penalty, an overlong/format "
    "penalty or a reward model adds levels. Use a 0/1 (REWARD=math) or -1/+1 (REWARD=paper) reward without shaping "
    "for bnpo."
)


def compute_bnpo_advantages(batch: Batch) -> Advantages:
    """BNPO advantages (r - p_q) / max(eps, Beta(alpha, beta) pdf at p_q) of ``batch``'s rows grouped by uid
    (``row_values`` not read), shape ``(bs,)``; padding rows get 0.

    Rewards in [0, 1] are used as they are. The paper's -1/+1 reward is first mapped to pass rates x = (r + 1)/2
    (as EBPO-BB does), the formula applied to x, and the advantage mapped back to reward units: 2 (x - p_q) / pdf
    = (r - (2 p_q - 1)) / pdf. Other rewards raise ValueError naming the cause. Diagnostics ``bnpo/alpha``,
    ``bnpo/beta`` and ``bnpo/max_abs_adv`` (1/pdf reaches ~1e6 on a concentrated batch,
    docs/paper_notes.md#fork-baselines).
    """
    g = batch.uid_groups()
    if len(g.keys) == 0:
        return Advantages(scatter_rows(batch.scores, g, g.r), {})
    lo, span = pass_levels(g, BNPO_REFUSAL)
    if span != 1.0:  # -1/+1 -> pass indicator 0/1; group means and variances follow exactly (affine map)
        g.r, g.mean, g.var = (g.r - lo) / span, (g.mean - lo) / span, g.var / (span * span)
    # (alpha, beta) from the per-prompt mean rewards: method of moments, then 1 + a/3, 1 + b/3
    n = len(g.keys)
    mean = (sorted_sum(g.mean) / n).item()
    var = (sorted_sum((g.mean - mean) ** 2) / (n - 1)).item() if n >= 2 else 0.0
    m = min(max(mean, EPS), 1.0 - EPS)
    a = b = 0.0
    if EPS < var < m * (1.0 - m):
        nu = m * (1.0 - m) / var - 1.0
        a, b = nu * m, nu * (1.0 - m)
    alpha, beta = 1.0 + a / 3.0, 1.0 + b / 3.0
    p = g.mean.clamp(EPS, 1.0 - EPS)
    log_norm = math.lgamma(alpha) + math.lgamma(beta) - math.lgamma(alpha + beta)
    pdf = torch.exp((alpha - 1.0) * torch.log(p) + (beta - 1.0) * torch.log1p(-p) - log_norm).clamp_min(EPS)
    adv = span * (g.r - g.mean.index_select(0, g.row_group)) / pdf.index_select(0, g.row_group)
    diagnostics = {
        "bnpo/alpha": alpha,
        "bnpo/beta": beta,
        "bnpo/max_abs_adv": adv.abs().max().item() if adv.numel() else 0.0,
    }
    return Advantages(scatter_rows(batch.scores, g, adv), diagnostics)


# ----------------------------------------------------------------------------------------------- spo


@dataclass(frozen=True)
class SPOOptions(OptionSection):
    """Options of the ``spo`` estimator (``algorithm.spo.<key>``); defaults = the fork's tracker."""

    SECTION: ClassVar[str] = "algorithm.spo"

    prompt_key: str = prompt_key_option(
        "the extra_info field that identifies a prompt across steps (default index, the row index ebpo_verl.data "
        "writes; it must be unique per prompt over the training files)"
    )
    rho: float = option(0.9, "the tracker's discount per update", rule=reals(0.0, 1.0, open_low=True, open_high=True))
    n0: float = option(
        8.0,
        "the prior's strength: a prompt's first update starts from (n0/2, n0/2); the fork's 1/(1 - 0.875) = 8",
        rule=reals(0.0, MAX_COUNT, open_low=True),
    )
    epsilon: float = option(1e-6, "the eps of the batch standardisation", rule=reals(0.0, open_low=True))
    on_resume_mismatch: str = resume_option(
        "a resume whose options differ from the checkpoint's: error (stop, listing the changes), reset (fresh "
        "tracker, with a warning) or keep (the saved tracker; never for a changed prompt_key)"
    )


class SPOState(PromptTracker):
    """The SPO tracker of one training run: a :class:`~ebpo_verl.algos.tracker.PromptTracker`."""

    label = "SPO"


def compute_spo_advantages(batch: Batch, options: SPOOptions, state: SPOState) -> Advantages:
    """SPO advantages, shape ``(bs,)``, batch-standardised (padding rows get 0), and the step's ``spo/*``
    diagnostics. Updates ``state`` (the tracker) in place. The rows are grouped by their stable prompt keys,
    ``row_values`` (:func:`tracker.prompt_groups`); padding rows get advantage 0 and never touch the tracker."""
    g = prompt_groups(batch, "spo", "tracker", options.prompt_key)
    if len(g.keys) == 0:
        return Advantages(scatter_rows(batch.scores, g, g.r), {})
    pos, found = state.lookup(g.keys)
    half = float(options.n0) / 2.0
    old_alpha, old_beta = state.counts(pos, found, (half, half))
    baseline = torch.from_numpy(np.where(found, old_alpha / (old_alpha + old_beta), 0.5))
    adv = standardise(g.r - baseline.index_select(0, g.row_group), float(options.epsilon))
    rbar = g.mean.clamp(0.0, 1.0).numpy()
    rho = float(options.rho)
    state.update(g.keys, pos, found, rho * old_alpha + rbar, rho * old_beta + (1.0 - rbar))
    diagnostics = {
        "spo/baseline_mean": (sorted_sum(baseline) / len(baseline)).item(),
        "spo/frac_seen": float(found.mean()),
        "spo/prompts_tracked": float(len(state.keys)),
    }
    return Advantages(scatter_rows(batch.scores, g, adv), diagnostics)


SPECS = (
    EstimatorSpec(
        "shrinkage_js",
        "James-Stein shrinkage: the leave-one-out group mean shrunk toward the leave-one-prompt-out batch mean",
        "arXiv 2511.03710 (Zeng et al.), as the authors' fork runs it", compute=compute_js_advantages,
    ),
    EstimatorSpec(
        "bnpo", "BNPO: (r - p_q) / f(p_q; alpha, beta), the Beta pdf fitted by moments to the batch's pass rates",
        "arXiv 2506.02864 (Xiao et al.)", compute=compute_bnpo_advantages,
        pass_rates=always("it fits a Beta distribution to pass rates"),
    ),
    EstimatorSpec(
        "spo", "SPO: a per-prompt Beta tracker's mean as baseline, batch-standardised (the fork's simplified form)",
        "arXiv 2509.13232 (Xu & Ding)", compute=compute_spo_advantages, options_cls=SPOOptions,
        state=StateSpec(SPOState, "spo_state.json", "SPO", "SPO trackers (baseline 0.5)", never_keep=("prompt_key",)),
        row_input="prompt_key", unique_row_key=True,
    ),
)  # fmt: skip
