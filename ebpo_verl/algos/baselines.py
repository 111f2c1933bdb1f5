"""The v2 draft's other baselines: James-Stein shrinkage, BNPO and SPO (torch / numpy, no verl import).

Formulas as the authors' fork implements them (``docs/paper_notes.md#fork-baselines``); the
verl-registered wrappers are in :mod:`ebpo_verl.trainer.adapter` under the fork's names ``shrinkage_js``, ``bnpo``
and ``spo``. Responses are grouped by prompt uid (``shrinkage_js``, ``bnpo``) or by a stable prompt key
(``spo``); padding rows (``valid`` False) get advantage 0 and enter no statistic. Every sum runs over values in
sorted order, so results do not depend on the order of the rows.

- ``shrinkage_js`` (Zeng et al., "Shrinking the Variance", arXiv 2511.03710): per prompt i with m_i responses,
  mean mu_i and w_i = s_i^2 / m_i (unbiased variance; 0 for m_i = 1). Leaving prompt i out of the n prompts:
  mbar_i = mean of the other means, s_i = (sum_{k!=i} mu_k^2 - (n-1) mbar_i^2) / (n-1) floored at 0,
  v_i = mean of the other w; lambda_i = ((n-1)/n) v_i / (v_i + s_i) (0 when v_i + s_i <= 1e-6). Response j's
  baseline is (1 - lambda_i) mu_i^{-j} + lambda_i mbar_i, mu_i^{-j} the leave-one-out mean of its group (plain
  mu_i when n = 1 or m_i = 1); A = r - baseline, not normalised. A lone response (m_i = 1) thus gets
  A = lambda_i (r - mbar_i), as the formula reads (docs/paper_notes.md#fork-baselines); the fork's code gives it 0.
- ``bnpo`` (Xiao et al., "BNPO: Beta Normalization Policy Optimization", arXiv 2506.02864): p_q = group mean;
  over the batch's prompts mean_p and unbiased var_p (0 for one prompt); m = clamp(mean_p, eps, 1-eps); when
  eps < var_p < m(1-m): nu = m(1-m)/var_p - 1, a = nu m, b = nu (1-m), else a = b = 0; alpha = 1 + a/3,
  beta = 1 + b/3; A = (r - p_q) / max(eps, Beta(alpha, beta) pdf at clamp(p_q, eps, 1-eps)); eps = 1e-6.
  Rewards must lie in [0, 1]; the paper's -1/+1 reward is mapped to pass rates (r + 1)/2 first and the
  advantage mapped back (times 2), as EBPO-BB does; other rewards raise.
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from ebpo_verl.algos.ebpo import factorize_keys, padding_names
from ebpo_verl.options.parsing import OptionSection, is_real, option, reals, text

EPS = 1e-6
"""The fork's fixed epsilon of ``shrinkage_js`` and ``bnpo``."""
SPO_STATE_VERSION = 1


# ---------------------------------------------------------------------------------------------- shared


@dataclass
class _Groups:
    """The valid rows of a batch grouped by prompt: rewards (float64), row -> group, per-group size and moments."""

    rows: torch.Tensor  # positions of the valid rows in the batch
    r: torch.Tensor  # their rewards
    row_group: torch.Tensor  # group of each valid row
    keys: np.ndarray  # sorted group keys (str)
    size: torch.Tensor  # responses per group
    mean: torch.Tensor  # group mean reward
    var: torch.Tensor  # unbiased within-group variance (0 for a group of one)


def _group(
    scores: torch.Tensor,
    keys: Sequence[Any] | np.ndarray,
    valid: torch.Tensor,
    what: str,
    pad_prefix: str | None = None,
) -> _Groups:
    """Group the valid rows by ``keys`` (compared as strings, factorized as the ``ebpo`` estimator does: no
    per-row string conversion); rows whose key starts with ``pad_prefix`` are padding too; NaN/inf rewards raise,
    naming the keys."""
    bs = scores.shape[0]
    key_arr = np.asarray(keys, dtype=object)
    if key_arr.shape != (bs,) or tuple(valid.shape) != (bs,):
        raise ValueError(f"{what} {key_arr.shape} and valid {tuple(valid.shape)} must have shape ({bs},)")
    valid_np = valid.detach().cpu().numpy().astype(bool)
    codes, names = factorize_keys(key_arr, missing=True)  # None, NaN, pandas NA -> -1
    is_pad = padding_names(names, pad_prefix) if pad_prefix is not None else None
    if is_pad is not None:
        valid_np &= ~(is_pad[codes] & (codes >= 0))
    rows_np = np.flatnonzero(valid_np)
    rows = torch.from_numpy(rows_np)
    r = scores.detach().to(torch.float64).cpu().index_select(0, rows)
    codes = codes[rows_np]
    missing = codes < 0
    if missing.any():
        first = rows_np[missing][:10].tolist()
        raise ValueError(f"{int(missing.sum())} valid row(s) have no {what} (None/NaN); first rows: {first}")
    used = np.bincount(codes, minlength=len(names)) > 0
    if not used.all():  # names of padding rows only
        codes = (np.cumsum(used) - 1)[codes]
        names = names[used]
    names = names.astype(str)
    order = np.argsort(names, kind="stable")  # sorted keys: the same groups whatever the row order
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    group_keys = names[order]
    bad = ~torch.isfinite(r)
    if bool(bad.any()):
        offenders = sorted(set(group_keys[rank[codes[bad.numpy()]]].tolist()))
        raise ValueError(f"non-finite (NaN/inf) rewards for {what} {offenders[:20]}: check the reward function")
    row_group = torch.from_numpy(rank[codes].astype(np.int64, copy=False))
    n = len(group_keys)
    r_sorted, r_order = torch.sort(r, stable=True)  # sums in value order: independent of the row order
    g_sorted = row_group.index_select(0, r_order)
    size = torch.zeros(n, dtype=torch.float64).index_add_(0, g_sorted, torch.ones_like(r))
    mean = torch.zeros(n, dtype=torch.float64).index_add_(0, g_sorted, r_sorted) / size.clamp_min(1.0)
    dev = r_sorted - mean.index_select(0, g_sorted)
    m2 = torch.zeros(n, dtype=torch.float64).index_add_(0, g_sorted, dev * dev)
    var = torch.where(size >= 2, m2 / (size - 1).clamp_min(1.0), torch.zeros_like(m2))
    return _Groups(rows, r, row_group, group_keys, size, mean, var)


def _sorted_sum(values: torch.Tensor) -> torch.Tensor:
    return torch.sort(values).values.sum()


def _standardise(adv: torch.Tensor, eps: float) -> torch.Tensor:
    """(A - mean) / (unbiased std + eps) over the batch; a single row gets 0."""
    n = adv.numel()
    mean = _sorted_sum(adv) / n
    var = _sorted_sum((adv - mean) ** 2) / (n - 1) if n >= 2 else torch.zeros((), dtype=adv.dtype)
    return (adv - mean) / (var.sqrt() + eps)


def _scatter_out(scores: torch.Tensor, g: _Groups, adv: torch.Tensor) -> torch.Tensor:
    """Advantages of the valid rows at their batch positions, 0 elsewhere; dtype of ``scores`` if floating."""
    dtype = scores.dtype if scores.is_floating_point() else torch.get_default_dtype()
    out = torch.zeros(scores.shape[0], dtype=dtype, device=scores.device)
    return out.index_copy_(0, g.rows.to(out.device), adv.to(dtype=dtype, device=scores.device))


# ------------------------------------------------------------------------------------- shrinkage_js


def compute_js_advantages(
    scores: torch.Tensor, index: Sequence[Any] | np.ndarray, valid: torch.Tensor, pad_prefix: str | None = None
) -> torch.Tensor:
    """James-Stein (leave-one-out) shrinkage advantages, shape ``(bs,)``; padding rows get 0.

    Args:
        scores: response rewards, shape (bs,).
        index: per-response prompt uids (compared as strings).
        valid: False for padding rows.
        pad_prefix: rows whose uid starts with it are padding too (verl's ``pad`` rows).
    """
    g = _group(scores, index, valid, "uid(s)", pad_prefix)
    n = len(g.keys)
    if n == 0:
        return _scatter_out(scores, g, g.r)
    w = g.var / g.size
    if n == 1:
        lam = torch.zeros(1, dtype=torch.float64)
        mbar = g.mean
        mu_own = g.mean.index_select(0, g.row_group)
    else:
        # leave-one-out sums on means shifted by their average (the variance is shift-invariant; less cancellation)
        shift = _sorted_sum(g.mean) / n
        c = g.mean - shift
        others = (_sorted_sum(c) - c) / (n - 1)  # mbar_i - shift
        mbar = shift + others
        s = ((_sorted_sum(c * c) - c * c) - (n - 1) * others * others) / (n - 1)
        s = s.clamp_min(0.0)
        v = (_sorted_sum(w) - w) / (n - 1)
        total = v + s
        lam = torch.where(total > EPS, ((n - 1) / n) * v / total.clamp_min(EPS), torch.zeros_like(total))
        m_row = g.size.index_select(0, g.row_group)
        mu_row = g.mean.index_select(0, g.row_group)
        loo = (m_row * mu_row - g.r) / (m_row - 1).clamp_min(1.0)
        mu_own = torch.where(m_row > 1, loo, mu_row)
    lam_row = lam.index_select(0, g.row_group)
    baseline = (1.0 - lam_row) * mu_own + lam_row * mbar.index_select(0, g.row_group)
    return _scatter_out(scores, g, g.r - baseline)


# ---------------------------------------------------------------------------------------------- bnpo


def bnpo_beta_parameters(pass_rates: torch.Tensor) -> tuple[float, float]:
    """BNPO's (alpha, beta) from the batch's per-prompt mean rewards (method of moments, then 1 + a/3, 1 + b/3)."""
    n = pass_rates.numel()
    mean = (_sorted_sum(pass_rates) / n).item()
    var = (_sorted_sum((pass_rates - mean) ** 2) / (n - 1)).item() if n >= 2 else 0.0
    m = min(max(mean, EPS), 1.0 - EPS)
    a = b = 0.0
    if EPS < var < m * (1.0 - m):
        nu = m * (1.0 - m) / var - 1.0
        a, b = nu * m, nu * (1.0 - m)
    return 1.0 + a / 3.0, 1.0 + b / 3.0


BNPO_DIAGNOSTICS: dict[str, float] = {}
"""The ``bnpo/*`` diagnostics of this process's last :func:`compute_bnpo_advantages` call (the trainer logs them)."""


def _bnpo_levels(g: _Groups) -> tuple[float, float]:
    """(lowest level, span) mapping rewards to pass rates: [0, 1] -> (0, 1), the paper's -1/+1 -> (-1, 2)."""
    r = g.r
    if r.numel() == 0 or bool(((r >= 0.0) & (r <= 1.0)).all()):
        return 0.0, 1.0
    if bool(((r == -1.0) | (r == 1.0)).all()):
        return -1.0, 2.0
    bad = (r < 0.0) | (r > 1.0)
    offenders = sorted(set(g.keys[g.row_group[bad].numpy()].tolist()))
    values = torch.unique(r).tolist()
    raise ValueError(
        f"bnpo needs rewards in [0, 1] (pass rates: it fits a Beta distribution to the group means) or the paper's "
        f"two-level -1/+1 reward, but this batch has reward values {values[:8]}{' ...' if len(values) > 8 else ''} "
        f"(uid(s) {offenders[:20]}). Such values come from a shaped or rescaled reward: "
        "algorithm.use_kl_in_reward=True subtracts a KL penalty, an overlong/format penalty or a reward model "
        "adds levels. Use a 0/1 (REWARD=math) or -1/+1 (REWARD=paper) reward without shaping for bnpo."
    )


def compute_bnpo_advantages(
    scores: torch.Tensor, index: Sequence[Any] | np.ndarray, valid: torch.Tensor, pad_prefix: str | None = None
) -> torch.Tensor:
    """BNPO advantages (r - p_q) / max(eps, Beta(alpha, beta) pdf at p_q), shape ``(bs,)``; padding rows get 0.

    Rewards in [0, 1] are used as they are. The paper's -1/+1 reward is first mapped to pass rates x = (r + 1)/2
    (as EBPO-BB does), the formula applied to x, and the advantage mapped back to reward units: 2 (x - p_q) / pdf
    = (r - (2 p_q - 1)) / pdf. Other rewards raise ValueError naming the cause. Sets :data:`BNPO_DIAGNOSTICS`
    (``bnpo/max_abs_adv``: 1/pdf reaches ~1e6 on a concentrated batch, docs/paper_notes.md#fork-baselines).
    Args as :func:`compute_js_advantages`.
    """
    g = _group(scores, index, valid, "uid(s)", pad_prefix)
    BNPO_DIAGNOSTICS.clear()
    if len(g.keys) == 0:
        return _scatter_out(scores, g, g.r)
    lo, span = _bnpo_levels(g)
    if span != 1.0:  # -1/+1 -> pass indicator 0/1; group means and variances follow exactly (affine map)
        g.r, g.mean, g.var = (g.r - lo) / span, (g.mean - lo) / span, g.var / (span * span)
    alpha, beta = bnpo_beta_parameters(g.mean)
    p = g.mean.clamp(EPS, 1.0 - EPS)
    log_norm = math.lgamma(alpha) + math.lgamma(beta) - math.lgamma(alpha + beta)
    pdf = torch.exp((alpha - 1.0) * torch.log(p) + (beta - 1.0) * torch.log1p(-p) - log_norm).clamp_min(EPS)
    adv = span * (g.r - g.mean.index_select(0, g.row_group)) / pdf.index_select(0, g.row_group)
    BNPO_DIAGNOSTICS.update(
        {"bnpo/alpha": alpha, "bnpo/beta": beta, "bnpo/max_abs_adv": adv.abs().max().item() if adv.numel() else 0.0}
    )
    return _scatter_out(scores, g, adv)


# ----------------------------------------------------------------------------------------------- spo


@dataclass(frozen=True)
class SPOOptions(OptionSection):
    """Options of the ``spo`` estimator (``algorithm.spo.<key>``); defaults = the fork's tracker."""

    SECTION: ClassVar[str] = "algorithm.spo"

    prompt_key: str = option(
        "index",
        "the extra_info field that identifies a prompt across steps (default index, the row index data_prep "
        "writes; it must be unique per prompt over the training files)",
        rule=text("an extra_info field name"),
    )
    rho: float = option(0.9, "the tracker's discount per update", rule=reals(0.0, 1.0, open_low=True, open_high=True))
    n0: float = option(
        8.0,
        "the prior's strength: a prompt's first update starts from (n0/2, n0/2); the fork's 1/(1 - 0.875) = 8",
        rule=reals(0.0, open_low=True),
    )
    epsilon: float = option(1e-6, "the eps of the batch standardisation", rule=reals(0.0, open_low=True))
    on_resume_mismatch: str = option(
        "error",
        "a resume whose options differ from the checkpoint's: error (stop, listing the changes), reset (fresh "
        "tracker, with a warning) or keep (the saved tracker; never for a changed prompt_key)",
        choices=("error", "reset", "keep"),
    )


SPO_OPTION_KEYS: tuple[str, ...] = SPOOptions.keys()
SPO_RESUME_KEYS: tuple[str, ...] = tuple(k for k in SPO_OPTION_KEYS if k != "on_resume_mismatch")


def _empty_keys() -> np.ndarray:
    return np.array([], dtype=str)


def _empty_floats() -> np.ndarray:
    return np.array([], dtype=np.float64)


@dataclass
class SPOState:
    """The SPO tracker of one training run: sorted prompt keys with their (alpha, beta), plus last diagnostics."""

    steps: int = 0
    keys: np.ndarray = field(default_factory=_empty_keys)
    alpha: np.ndarray = field(default_factory=_empty_floats)
    beta: np.ndarray = field(default_factory=_empty_floats)
    diagnostics: dict[str, float] = field(default_factory=dict)

    def reset(self) -> None:
        self.__init__()

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(position in the tracker, found) of each key of the sorted, unique array ``keys``."""
        pos = np.searchsorted(self.keys, keys)
        inside = np.minimum(pos, max(len(self.keys) - 1, 0))
        found = (pos < len(self.keys)) & (self.keys[inside] == keys) if len(self.keys) else np.zeros(len(keys), bool)
        return inside, found

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable, versioned snapshot (floats round-trip exactly through ``json``)."""
        return {
            "version": SPO_STATE_VERSION,
            "steps": self.steps,
            "keys": self.keys.tolist(),
            "alpha": self.alpha.tolist(),
            "beta": self.beta.tolist(),
        }

    def load_state_dict(self, state: Any) -> None:
        """Restore a :meth:`state_dict` snapshot; every field is checked (as ``EBPOState.load_state_dict``), and
        a bad one raises ValueError, leaving this state unchanged."""
        if not isinstance(state, Mapping):
            raise ValueError(f"SPO state must be a JSON object, got {type(state).__name__}")
        version = state.get("version")
        if version != SPO_STATE_VERSION:
            raise ValueError(f"SPO state version {version!r} is not supported (expected {SPO_STATE_VERSION})")
        missing = {"steps", "keys", "alpha", "beta"} - set(state)
        if missing:
            raise ValueError(f"SPO state is missing key(s) {sorted(missing)}")
        steps = state["steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"SPO state steps={steps!r} must be an integer >= 0")
        columns = {}
        for name in ("keys", "alpha", "beta"):
            values = state[name]
            if not isinstance(values, list) or any(isinstance(v, (list, dict)) for v in values):
                raise ValueError(f"SPO state {name} must be a flat list, got {str(values)[:60]}")
            columns[name] = values
        if not all(isinstance(k, str) for k in columns["keys"]):
            raise ValueError("SPO state keys must be strings")
        if not all(is_real(v) for v in columns["alpha"] + columns["beta"]):
            raise ValueError("SPO state alpha/beta must be finite numbers")
        keys = np.array(columns["keys"], dtype=str)
        alpha = np.array(columns["alpha"], dtype=np.float64)
        beta = np.array(columns["beta"], dtype=np.float64)
        if not (len(keys) == len(alpha) == len(beta)):
            raise ValueError(f"SPO state has {len(keys)} keys but {len(alpha)} alpha and {len(beta)} beta values")
        if len(keys) and not bool(np.all(keys[1:] > keys[:-1])):
            raise ValueError("SPO state keys are not sorted and unique")
        if not ((alpha > 0).all() and (beta > 0).all()):
            raise ValueError("SPO state has non-positive alpha/beta values")
        self.__init__(steps, keys, alpha, beta)


SPO_STATE = SPOState()
"""The SPO tracker of this process (the TaskRunner computes advantages; the trainer checkpoints it)."""


def compute_spo_advantages(
    scores: torch.Tensor,
    prompt_keys: Sequence[Any] | np.ndarray,
    valid: torch.Tensor,
    options: SPOOptions,
    state: SPOState,
) -> torch.Tensor:
    """SPO advantages, shape ``(bs,)``, batch-standardised; padding rows get 0. Updates ``state`` in place.

    Args:
        scores: response rewards, shape (bs,).
        prompt_keys: per-response stable prompt keys (compared as strings; None/NaN only on padding rows).
        valid: False for padding rows; they get advantage 0 and never touch the tracker.
        options: estimator options.
        state: the tracker.
    """
    g = _group(scores, prompt_keys, valid, f"prompt key(s) (extra_info[{options.prompt_key!r}])")
    if len(g.keys) == 0:
        state.diagnostics = {}
        return _scatter_out(scores, g, g.r)
    pos, found = state.lookup(g.keys)
    half = float(options.n0) / 2.0
    old_alpha = np.where(found, state.alpha[pos] if len(state.keys) else half, half)
    old_beta = np.where(found, state.beta[pos] if len(state.keys) else half, half)
    baseline = torch.from_numpy(np.where(found, old_alpha / (old_alpha + old_beta), 0.5))
    adv = _standardise(g.r - baseline.index_select(0, g.row_group), float(options.epsilon))

    rbar = g.mean.clamp(0.0, 1.0).numpy()
    rho = float(options.rho)
    new_alpha, new_beta = rho * old_alpha + rbar, rho * old_beta + (1.0 - rbar)
    state.alpha[pos[found]] = new_alpha[found]
    state.beta[pos[found]] = new_beta[found]
    if not found.all():
        keys = np.concatenate([state.keys, g.keys[~found]])
        order = np.argsort(keys, kind="stable")
        state.keys = keys[order]
        state.alpha = np.concatenate([state.alpha, new_alpha[~found]])[order]
        state.beta = np.concatenate([state.beta, new_beta[~found]])[order]
    state.steps += 1
    state.diagnostics = {
        "spo/baseline_mean": (_sorted_sum(baseline) / len(baseline)).item(),
        "spo/frac_seen": float(found.mean()),
        "spo/prompts_tracked": float(len(state.keys)),
    }
    return _scatter_out(scores, g, adv)
