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
  > 0 since alpha, beta > 0;
- advantage, GRPO-DBB: A_i = (X_i - p_hat) / sqrt(p_hat (1 - p_hat)), Eqs. 12-13 put into GRPO's Eq. 2 (the
  paper writes the estimates, not this line); ``normalize=False`` gives the Dr.GRPO-DBB form A_i = X_i - p_hat
  (Sec. 5.4).

A prompt is identified across steps by a stable key (as ``spo``'s tracker, :mod:`ebpo_verl.algos.baselines`): verl's uid
is fresh every step. All rows of one key in a batch are one visit (their S and N are summed). Rewards must be
0/1 (or in [0, 1], read as fractional successes); the paper's -1/+1 reward is mapped to x = (r + 1)/2 first.
Prompts absent from a batch are not discounted (one discount per visit, as the paper's once-per-epoch visits).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from ebpo_verl.algos.baselines import _group, _scatter_out, _sorted_sum
from ebpo_verl.options.parsing import OptionSection, is_real, option, reals, text

DBB_STATE_VERSION = 1


@dataclass(frozen=True)
class DBBOptions(OptionSection):
    """Options of the ``dbb`` estimator (``algorithm.dbb.<key>``); defaults = the paper's 8B setting."""

    SECTION: ClassVar[str] = "algorithm.dbb"

    prompt_key: str = option(
        "index",
        "the extra_info field that identifies a prompt across steps (unique per prompt; index)",
        rule=text("an extra_info field name"),
    )
    discount: float = option(
        0.75,
        "lambda: 0.75 for Qwen3-8B, 0.5 for Qwen3-1.7B (Sec. 4.2); 1 keeps all history",
        rule=reals(0.0, 1.0, open_low=True),
    )
    prior_alpha: float = option(
        1.0, "prior pseudo-successes before the first visit (Def. 1: 1)", rule=reals(0.0, open_low=True)
    )
    prior_beta: float = option(
        1.0, "prior pseudo-failures before the first visit (Def. 1: 1)", rule=reals(0.0, open_low=True)
    )
    normalize: bool = option(
        True, "divide by sqrt(p_hat (1 - p_hat)) (GRPO-DBB); false: A = X - p_hat (Dr.GRPO-DBB)", choices=(True, False)
    )
    on_resume_mismatch: str = option(
        "error",
        "a resume whose options differ from the checkpoint's: error, reset or keep (never for a changed "
        "prompt_key), as algorithm.spo.on_resume_mismatch",
        choices=("error", "reset", "keep"),
    )


@dataclass
class DBBState:
    """The posteriors of one training run: sorted prompt keys with their (alpha, beta), the number of calls, and
    the last call's diagnostics (not saved)."""

    steps: int = 0
    keys: np.ndarray = field(default_factory=lambda: np.array([], dtype=str))
    alpha: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.float64))
    beta: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.float64))
    diagnostics: dict[str, float] = field(default_factory=dict)

    def reset(self) -> None:
        self.__init__()

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable, versioned snapshot (floats round-trip exactly through ``json``)."""
        return {
            "version": DBB_STATE_VERSION,
            "steps": self.steps,
            "keys": self.keys.tolist(),
            "alpha": self.alpha.tolist(),
            "beta": self.beta.tolist(),
        }

    def load_state_dict(self, state: Any) -> None:
        """Restore a :meth:`state_dict` snapshot; a bad field raises ValueError naming it, leaving this state as
        it was."""
        if not isinstance(state, Mapping):
            raise ValueError(f"DBB state must be a JSON object, got {type(state).__name__}")
        version = state.get("version")
        if version != DBB_STATE_VERSION:
            raise ValueError(f"DBB state version {version!r} is not supported (expected {DBB_STATE_VERSION})")
        missing = sorted({"steps", "keys", "alpha", "beta"} - set(state))
        if missing:
            raise ValueError(f"DBB state is missing key(s) {missing}")
        steps = state["steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"DBB state steps={steps!r} must be an integer >= 0")
        for name in ("keys", "alpha", "beta"):
            if not isinstance(state[name], list):
                raise ValueError(f"DBB state {name} must be a list, got {str(state[name])[:60]}")
        if not all(isinstance(k, str) for k in state["keys"]):
            raise ValueError("DBB state keys must be strings")
        if not all(is_real(v) and v > 0 for v in state["alpha"] + state["beta"]):
            raise ValueError("DBB state alpha/beta must be finite numbers > 0")
        keys = np.array(state["keys"], dtype=str)
        alpha, beta = np.array(state["alpha"], dtype=np.float64), np.array(state["beta"], dtype=np.float64)
        if not len(keys) == len(alpha) == len(beta):
            raise ValueError(f"DBB state has {len(keys)} keys but {len(alpha)} alpha and {len(beta)} beta values")
        if len(keys) > 1 and not bool(np.all(keys[1:] > keys[:-1])):
            raise ValueError("DBB state keys are not sorted and unique")
        self.__init__(steps, keys, alpha, beta)


DBB_STATE = DBBState()
"""The DBB posteriors of this process (the TaskRunner computes advantages; the trainer checkpoints them)."""


def _successes(g: Any) -> tuple[torch.Tensor, float]:
    """Rewards as successes x in [0, 1] and the reward span (1, or 2 for the paper's -1/+1 reward)."""
    r = g.r
    if r.numel() == 0 or bool(((r >= 0.0) & (r <= 1.0)).all()):
        return r, 1.0
    if bool(((r == -1.0) | (r == 1.0)).all()):
        return (r + 1.0) / 2.0, 2.0
    bad = sorted(set(g.keys[g.row_group[(r < 0.0) | (r > 1.0)].numpy()].tolist()))
    raise ValueError(
        f"dbb needs 0/1 rewards (a Beta-Bernoulli posterior counts successes; values in [0, 1] count as fractions) "
        f"or the paper's -1/+1 reward; prompt key(s) {bad[:20]} have rewards {torch.unique(r).tolist()[:8]}. "
        "Use REWARD=math or REWARD=paper without shaping (no use_kl_in_reward, no overlong/format penalty)."
    )


def compute_dbb_advantages(
    scores: torch.Tensor,
    prompt_keys: Sequence[Any] | np.ndarray,
    valid: torch.Tensor,
    options: DBBOptions,
    state: DBBState,
) -> torch.Tensor:
    """DBB advantages, shape ``(bs,)``: each visited prompt's posterior is updated with this step's S and N
    (Eq. 11), then A_i = (X_i - p_hat) / sqrt(p_hat (1 - p_hat)) with p_hat = alpha / (alpha + beta) (Eqs. 12-13;
    ``normalize=False``: X_i - p_hat), in reward units. Padding rows (``valid`` False) get 0 and never touch the
    state; ``state`` is updated in place.

    Args:
        scores: response rewards, shape (bs,).
        prompt_keys: per-response stable prompt keys (compared as strings; None/NaN only on padding rows).
        valid: False for padding rows.
        options: estimator options.
        state: the posteriors.
    """
    g = _group(scores, prompt_keys, valid, f"prompt key(s) (extra_info[{options.prompt_key!r}])")
    if len(g.keys) == 0:
        state.diagnostics = {}
        return _scatter_out(scores, g, g.r)
    x, span = _successes(g)
    pos = np.searchsorted(state.keys, g.keys)
    found = np.zeros(len(g.keys), dtype=bool)
    inside = pos < len(state.keys)
    found[inside] = state.keys[pos[inside]] == g.keys[inside]
    old_alpha = np.full(len(g.keys), float(options.prior_alpha))
    old_beta = np.full(len(g.keys), float(options.prior_beta))
    old_alpha[found], old_beta[found] = state.alpha[pos[found]], state.beta[pos[found]]
    s = torch.zeros(len(g.keys), dtype=torch.float64).index_add_(0, g.row_group, x).numpy()
    lam = float(options.discount)
    alpha, beta = lam * old_alpha + s, lam * old_beta + (g.size.numpy() - s)  # Eq. 11
    state.alpha[pos[found]], state.beta[pos[found]] = alpha[found], beta[found]
    if not found.all():
        keys = np.concatenate([state.keys, g.keys[~found]])
        order = np.argsort(keys, kind="stable")
        state.keys = keys[order]
        state.alpha = np.concatenate([state.alpha, alpha[~found]])[order]
        state.beta = np.concatenate([state.beta, beta[~found]])[order]
    state.steps += 1
    p_hat = torch.from_numpy(alpha / (alpha + beta))  # Eq. 12
    centred = x - p_hat.index_select(0, g.row_group)
    if options.normalize:
        adv = centred / torch.sqrt(p_hat * (1.0 - p_hat)).index_select(0, g.row_group)  # Eq. 13
    else:
        adv = span * centred
    state.diagnostics = {
        "dbb/baseline_mean": (_sorted_sum(p_hat) / len(p_hat)).item(),
        "dbb/frac_seen": float(found.mean()),
        "dbb/prompts_tracked": float(len(state.keys)),
        "dbb/pseudo_count_mean": float(np.sort(alpha + beta).sum() / len(alpha)),
    }
    return _scatter_out(scores, g, adv)
