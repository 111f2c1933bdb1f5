"""Discounted Beta-Bernoulli reward estimation (DBB, arXiv 2603.18444): math and per-prompt state (no verl import).

DBB keeps, for every training prompt q, a Beta(alpha_q, beta_q) posterior over its pass rate, discounted by
lambda at each visit so that old rewards (from an older policy) fade. Equation numbers are the paper's v1
(19 Mar 2026; ``../shared/DBB_NOTES.md``):

- prior (Def. 1, Alg. 1 line 1): (alpha_0, beta_0) = (1, 1) for every prompt;
- update at a visit with N responses of which S succeed (Eq. 11, Alg. 1 line 10):
  alpha_tau = lambda alpha_{tau-1} + S,  beta_tau = lambda beta_{tau-1} + N - S; the prior is discounted as well
  (Eq. 16), so a first visit gives (lambda + S, lambda + N - S);
- the posterior is updated *before* the advantage (Alg. 1 lines 9-11), so this step's rewards are in it;
- baseline p_hat = alpha_tau / (alpha_tau + beta_tau) (Eq. 12) and variance p_hat (1 - p_hat) (Eq. 13), which is
  > 0 since alpha, beta > 0, but in float64 p_hat rounds to exactly 1 (or 0) once beta (alpha) is about 1e-16 of
  the other, as discounting makes it for a prompt always solved (failed): there :data:`VAR_FLOOR` replaces 0;
- advantage, GRPO-DBB: A_i = (X_i - p_hat) / sqrt(p_hat (1 - p_hat)), Eqs. 12-13 put into GRPO's Eq. 2 (the
  paper writes the estimates, not this line); ``normalize=False`` gives the Dr.GRPO-DBB form A_i = X_i - p_hat
  (Sec. 5.4).

A prompt is identified across steps by a stable key (as ``spo``'s tracker, :mod:`ebpo_verl.algos.baselines`): verl's uid
is fresh every step. All rows of one key in a batch are one visit (their S and N are summed). Rewards must be
0/1 (or in [0, 1], read as fractional successes); the paper's -1/+1 reward is mapped to x = (r + 1)/2 first.
Prompts absent from a batch are not discounted (one discount per visit, as the paper's once-per-epoch visits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ebpo_verl.algos.estimator import Advantages, Batch
from ebpo_verl.algos.grouping import pass_levels, scatter_rows, sorted_sum
from ebpo_verl.algos.registry import EstimatorSpec, StateSpec, always
from ebpo_verl.algos.state_codec import MAX_COUNT
from ebpo_verl.algos.tracker import PromptTracker, prompt_groups, prompt_key_option
from ebpo_verl.options.parsing import OptionSection, option, reals, resume_option


@dataclass(frozen=True)
class DBBOptions(OptionSection):
    """Options of the ``dbb`` estimator (``algorithm.dbb.<key>``); defaults = the paper's 8B setting."""

    SECTION: ClassVar[str] = "algorithm.dbb"

    prompt_key: str = prompt_key_option(
        "the extra_info field that identifies a prompt across steps (unique per prompt; index)"
    )
    discount: float = option(
        0.75,
        "lambda: 0.75 for Qwen3-8B, 0.5 for Qwen3-1.7B (Sec. 4.2); 1 keeps all history",
        rule=reals(0.0, 1.0, open_low=True),
    )
    prior_alpha: float = option(
        1.0, "prior pseudo-successes before the first visit (Def. 1: 1)", rule=reals(0.0, MAX_COUNT, open_low=True)
    )
    prior_beta: float = option(
        1.0, "prior pseudo-failures before the first visit (Def. 1: 1)", rule=reals(0.0, MAX_COUNT, open_low=True)
    )
    normalize: bool = option(
        True, "divide by sqrt(p_hat (1 - p_hat)) (GRPO-DBB); false: A = X - p_hat (Dr.GRPO-DBB)", choices=(True, False)
    )
    on_resume_mismatch: str = resume_option(
        "a resume whose options differ from the checkpoint's: error, reset or keep (never for a changed "
        "prompt_key), as algorithm.spo.on_resume_mismatch"
    )


class DBBState(PromptTracker):
    """The DBB posteriors of one training run: a :class:`~ebpo_verl.algos.tracker.PromptTracker`."""

    label = "DBB"


VAR_FLOOR = 2.0**-53
"""p_hat (1 - p_hat) where it rounds to 0 (p_hat is exactly 0 or 1 in float64): its value at the float64 nearest 1
below it, so a row that agrees with such a p_hat gets 0 (the limit) and none gets NaN (docs/baselines.md)."""

DBB_REFUSAL = (
    "dbb needs 0/1 rewards (a Beta-Bernoulli posterior counts successes; values in [0, 1] count as fractions) or "
    "the paper's -1/+1 reward; prompt key(s) {keys} have rewards {values}. Use REWARD=math or REWARD=paper without "
    "shaping (no use_kl_in_reward, no overlong/format penalty)."
)


def compute_dbb_advantages(batch: Batch, options: DBBOptions, state: DBBState) -> Advantages:
    """DBB advantages, shape ``(bs,)``, and the step's ``dbb/*`` diagnostics: each visited prompt's posterior is
    updated with this step's S and N (Eq. 11), then A_i = (X_i - p_hat) / sqrt(p_hat (1 - p_hat)) with
    p_hat = alpha / (alpha + beta) (Eqs. 12-13; ``normalize=False``: X_i - p_hat), in reward units. Padding rows
    (``valid`` False) get 0 and never touch the state; ``state`` is updated in place. The rows are grouped by
    their stable prompt keys, ``row_values`` (:func:`tracker.prompt_groups`)."""
    g = prompt_groups(batch, "dbb", "posterior", options.prompt_key)
    if len(g.keys) == 0:
        return Advantages(scatter_rows(batch.scores, g, g.r), {})
    lo, span = pass_levels(g, DBB_REFUSAL)  # successes x in [0, 1]; the paper's -1/+1 mapped to (r + 1) / 2
    x = g.r if span == 1.0 else (g.r - lo) / span
    pos, found = state.lookup(g.keys)
    old_alpha, old_beta = state.counts(pos, found, (float(options.prior_alpha), float(options.prior_beta)))
    s = torch.zeros(len(g.keys), dtype=torch.float64).index_add_(0, g.row_group, x).numpy()
    lam = float(options.discount)
    alpha, beta = lam * old_alpha + s, lam * old_beta + (g.size.numpy() - s)  # Eq. 11
    state.update(g.keys, pos, found, alpha, beta)
    p_hat = torch.from_numpy(alpha / (alpha + beta))  # Eq. 12
    centred = x - p_hat.index_select(0, g.row_group)
    if options.normalize:
        var = p_hat * (1.0 - p_hat)  # Eq. 13; 0 only where p_hat rounded to 0 or 1: the float64 floor instead
        adv = centred / torch.sqrt(torch.where(var > 0.0, var, VAR_FLOOR)).index_select(0, g.row_group)
    else:
        adv = span * centred
    diagnostics = {
        "dbb/baseline_mean": (sorted_sum(p_hat) / len(p_hat)).item(),
        "dbb/frac_seen": float(found.mean()),
        "dbb/prompts_tracked": float(len(state.keys)),
        "dbb/pseudo_count_mean": float(np.sort(alpha + beta).sum() / len(alpha)),
    }
    return Advantages(scatter_rows(batch.scores, g, adv), diagnostics)


SPECS = (
    EstimatorSpec(
        "dbb", "Discounted Beta-Bernoulli: a per-prompt discounted Beta posterior's mean as baseline (GRPO-DBB)",
        "arXiv 2603.18444", compute=compute_dbb_advantages, options_cls=DBBOptions,
        state=StateSpec(DBBState, "dbb_state.json", "DBB", "DBB posteriors (prior Beta(prior_alpha, prior_beta))",
                        never_keep=("prompt_key",)),
        row_input="prompt_key", unique_row_key=True, pass_rates=always("a Beta-Bernoulli posterior counts successes"),
    ),
)  # fmt: skip
