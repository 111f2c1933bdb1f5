"""verl glue: registers the ``ebpo`` advantage estimator (loaded by the ``verl.plugins`` entry point).

The same module registers the v2 draft's baselines ``shrinkage_js``, ``bnpo`` and ``spo`` (math in
:mod:`ebpo_verl.baselines`) and Discounted Beta-Bernoulli ``dbb`` (math in :mod:`ebpo_verl.dbb`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from ebpo_verl.baselines import (
    SPO_STATE,
    SPOOptions,
    compute_bnpo_advantages,
    compute_js_advantages,
    compute_spo_advantages,
)
from ebpo_verl.dbb import DBB_STATE, DBBOptions, compute_dbb_advantages
from ebpo_verl.estimator import (
    GLOBAL_STATE,
    EBPOOptions,
    compute_ebpo_advantages,
    factorize_keys,
    padding_names,
    parsed_options,
)
from ebpo_verl.validation import ignored_options_warning

NAME = "ebpo"


def compute_ebpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config: Any = None,
    labels: np.ndarray | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EBPO outcome advantage (arXiv 2602.05165): A_i = r_i - [(1 - S) mu_q + S mu_glob], batch-standardised.

    The response score is ``token_level_rewards.sum(-1)``; options come from ``config.ebpo`` (``config`` is
    verl's ``algorithm`` node; None -> defaults; read once per node by :func:`~ebpo_verl.estimator.parsed_options`,
    not on every step); the running statistics are the process-wide
    ``ebpo_verl.get_state()``. Rows whose uid starts with ``pad`` or whose response mask is all zero are padding:
    advantage 0, statistics untouched. ``labels`` (one per row) feed per-cluster priors when
    ``algorithm.ebpo.cluster_key`` is set. Returns (advantages, returns), both (bs, response_length).
    """
    options = parsed_options(EBPOOptions, None if config is None else config.get("ebpo", None))
    _report_ignored_options(options)
    _check_shapes(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    valid = _has_response(response_mask)
    adv = compute_ebpo_advantages(scores, index, valid, options, GLOBAL_STATE, labels=labels, pad_prefix="pad")
    advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


_IGNORED_REPORTED: list[bool] = [False]
"""Whether this process has named the options the chosen mode ignores (once per process)."""


def _report_ignored_options(options: EBPOOptions) -> None:
    """On the first call in a process, warn about options the chosen mode ignores: plain ``verl.trainer.main_ppo``
    runs have no pre-flight to say so. ``ebpo-train``'s TaskRunner calls :func:`ignored_options_reported` first,
    as its driver's pre-flight already printed the warning."""
    if _IGNORED_REPORTED[0]:
        return
    _IGNORED_REPORTED[0] = True
    message = ignored_options_warning(options)
    if message:
        warnings.warn(f"EBPO: {message}", RuntimeWarning, stacklevel=3)


def ignored_options_reported() -> None:
    """Mark the ignored-options warning as given in this process (by the pre-flight)."""
    _IGNORED_REPORTED[0] = True


def _check_shapes(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> None:
    """(bs, L) rewards and an equal-shaped mask with L >= 1, else one ValueError naming both shapes."""
    shape, mask_shape = tuple(token_level_rewards.shape), tuple(response_mask.shape)
    if len(shape) != 2 or mask_shape != shape or shape[1] == 0:
        raise ValueError(
            "advantage estimators need token_level_rewards and response_mask of one shape (bs, response_length) with "
            f"response_length >= 1; got {shape} and {mask_shape}"
        )


def compute_shrinkage_js_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """James-Stein shrinkage baseline (Zeng et al., "Shrinking the Variance", arXiv 2511.03710), as the fork runs it.

    A_ij = r_ij - [(1 - lambda_i) mu_i^{-j} + lambda_i mbar_{-i}], lambda_i = ((n-1)/n) v_{-i} / (v_{-i} + s_{-i}):
    leave-one-out group mean shrunk toward the leave-one-prompt-out batch mean; no normalisation (details in
    :mod:`ebpo_verl.baselines`). Padding rows (uid ``pad*`` or an all-zero mask) get 0 and enter no statistic.
    Returns (advantages, returns), both (bs, response_length).
    """
    return _uid_grouped(compute_js_advantages, token_level_rewards, response_mask, index)


def compute_bnpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BNPO (Xiao et al., "BNPO: Beta Normalization Policy Optimization", arXiv 2506.02864).

    A = (r - p_q) / max(eps, f(p_q; alpha, beta)), p_q the group mean reward and f the Beta pdf with
    alpha = 1 + a/3, beta = 1 + b/3, (a, b) fitted by moments to the batch's p_q; eps = 1e-6. Padding rows get 0.
    Returns (advantages, returns), both (bs, response_length).
    """
    return _uid_grouped(compute_bnpo_advantages, token_level_rewards, response_mask, index)


def compute_spo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config: Any = None,
    prompt_keys: np.ndarray | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SPO (Xu & Ding, "Single-stream Policy Optimization", arXiv 2509.13232), the fork's simplified form.

    A = r - alpha_q / (alpha_q + beta_q) (0.5 for an unseen prompt), then (A - mean) / (std + eps) over the batch;
    afterwards each prompt's tracker does alpha <- rho alpha + rbar, beta <- rho beta + (1 - rbar), starting
    from (n0/2, n0/2). The tracker is ``ebpo_verl.baselines.SPO_STATE``, keyed by ``prompt_keys`` (one stable
    key per row, e.g. ``extra_info["index"]``, which ``python -m ebpo_verl.main`` passes); verl's uids are fresh
    every step, so without ``prompt_keys`` this raises rather than track nothing. Options: ``config.spo``.
    Returns (advantages, returns), both (bs, response_length).
    """
    options = parsed_options(SPOOptions, None if config is None else config.get("spo", None))
    if prompt_keys is None:
        raise ValueError(
            "adv_estimator=spo needs a stable prompt key per row (verl's uid is drawn afresh every step, so a "
            f"uid-keyed tracker never sees a prompt twice): train with `python -m ebpo_verl.main`, which passes "
            f"extra_info[{options.prompt_key!r}] (algorithm.spo.prompt_key), or pass prompt_keys=..."
        )
    _check_shapes(token_level_rewards, response_mask)
    valid = _has_response(response_mask).cpu()
    uid_codes, uid_names = factorize_keys(np.asarray(index, dtype=object))
    is_pad = padding_names(uid_names, "pad")
    if is_pad is not None:
        valid &= ~torch.from_numpy(is_pad[uid_codes])
    adv = compute_spo_advantages(token_level_rewards.sum(dim=-1), prompt_keys, valid, options, SPO_STATE)
    advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


def compute_dbb_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config: Any = None,
    prompt_keys: np.ndarray | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Discounted Beta-Bernoulli reward estimation (DBB, arXiv 2603.18444), GRPO-DBB form.

    Per prompt alpha <- lambda alpha + S, beta <- lambda beta + N - S from (1, 1) (Eq. 11), updated before the
    advantage; A_i = (X_i - p_hat) / sqrt(p_hat (1 - p_hat)), p_hat = alpha / (alpha + beta) (Eqs. 12-13). The
    posteriors are ``ebpo_verl.dbb.DBB_STATE``, keyed by ``prompt_keys`` (a stable key per row, as ``spo``'s);
    without them this raises. Options: ``config.dbb``. Returns (advantages, returns), both (bs, response_length).
    """
    options = parsed_options(DBBOptions, None if config is None else config.get("dbb", None))
    if prompt_keys is None:
        raise ValueError(
            "adv_estimator=dbb needs a stable prompt key per row (verl's uid is drawn afresh every step, so a "
            f"uid-keyed posterior never sees a prompt twice): train with `python -m ebpo_verl.main`, which passes "
            f"extra_info[{options.prompt_key!r}] (algorithm.dbb.prompt_key), or pass prompt_keys=..."
        )
    _check_shapes(token_level_rewards, response_mask)
    adv = compute_dbb_advantages(
        token_level_rewards.sum(dim=-1), prompt_keys, _unpadded(response_mask, index), options, DBB_STATE
    )
    advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


def _unpadded(response_mask: torch.Tensor, index: Any) -> torch.Tensor:
    """(bs,) bool on the CPU: rows with a response whose uid does not start with ``pad``."""
    valid = _has_response(response_mask).cpu()
    uid_codes, uid_names = factorize_keys(np.asarray(index, dtype=object))
    is_pad = padding_names(uid_names, "pad")
    if is_pad is not None:
        valid &= ~torch.from_numpy(is_pad[uid_codes])
    return valid


def _uid_grouped(
    compute: Callable[..., torch.Tensor], token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """A uid-grouped baseline on verl's inputs: scores = summed token rewards, padding = uid ``pad*`` or an
    all-zero mask (as the ``ebpo`` wrapper), advantages broadcast over the response tokens."""
    _check_shapes(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    adv = compute(scores, index, _has_response(response_mask).cpu(), pad_prefix="pad")
    advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


def _has_response(response_mask: torch.Tensor) -> torch.Tensor:
    """Rows with at least one response token. On an accelerator one pass over the mask (no host sync); on the
    CPU whole rows are read only where the first token is masked out."""
    if response_mask.device.type != "cpu":
        return response_mask.ne(0).any(dim=-1)
    has = response_mask[:, 0] != 0
    unsure = torch.nonzero(~has).squeeze(-1)
    if unsure.numel():
        has.index_copy_(0, unsure, response_mask.index_select(0, unsure).ne(0).any(dim=-1))
    return has


ESTIMATORS = {
    NAME: compute_ebpo_outcome_advantage,
    "shrinkage_js": compute_shrinkage_js_outcome_advantage,
    "bnpo": compute_bnpo_outcome_advantage,
    "spo": compute_spo_outcome_advantage,
    "dbb": compute_dbb_outcome_advantage,
}
"""Every estimator this package registers, by its verl name."""


def register() -> None:
    """Register ``ebpo``, ``shrinkage_js``, ``bnpo``, ``spo`` and ``dbb`` in verl's estimator registry; idempotent."""
    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    for name, ours in ESTIMATORS.items():
        current = registry.get(name)
        if current is not None and current is not ours and _same_definition(current, ours):
            del registry[name]  # this module was executed again (reload, second import name): replace our old copy
        if registry.get(name) is not ours:
            core_algos.register_adv_est(name)(ours)
        if core_algos.get_adv_estimator_fn(name) is not ours:
            raise RuntimeError(f"verl's registry holds a different '{name}' estimator")


def _same_definition(a: Any, b: Any) -> bool:
    """True when ``a`` is the same function from another execution of this file (reload, path import)."""
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return code_a is not None and (a.__qualname__, code_a.co_filename) == (b.__qualname__, code_b.co_filename)


register()
