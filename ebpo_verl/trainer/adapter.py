"""verl glue: registers the ``ebpo`` advantage estimator (loaded by the ``verl.plugins`` entry point).

The same module registers the v2 draft's baselines ``shrinkage_js``, ``bnpo`` and ``spo`` (math in
:mod:`ebpo_verl.algos.baselines`) and Discounted Beta-Bernoulli ``dbb`` (math in :mod:`ebpo_verl.algos.dbb`).

An estimator with memory is an object (:class:`ebpo_verl.algos.estimator.Estimator`: options, state, diagnostics),
and verl hands a registered estimator only the batch tensors and its raw ``algorithm`` node. So there are two
ways in, both through :func:`outcome_advantages` (verl's tensors -> scores, padding, broadcast):

- ``ebpo-train``: the trainer creates the run's object (:func:`new_estimator`), and its copy of verl's advantage
  step (``ebpo_verl.trainer.ray_trainer``, the one tested copy of a verl method) calls it directly with the step's
  tensors and per-row keys, where verl's ``compute_advantage`` would call the registered function. The call site
  shows which object's state changes; nothing travels beside the call, and no more of verl is copied.
- stock ``verl.trainer.main_ppo`` (no trainer of ours): the registered functions below use this process's
  default instance, :data:`DEFAULT_ESTIMATORS` (one per estimator), whose options come from the node by value
  (:func:`ebpo_verl.trainer.run_options.options_for_node`: validated when the node's value is new or changed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from ebpo_verl.algos.baselines import BNPOEstimator, SPOEstimator, compute_js_advantages
from ebpo_verl.algos.dbb import DBBEstimator
from ebpo_verl.algos.ebpo_math import EBPOEstimator
from ebpo_verl.algos.estimator import Advantages, Estimator
from ebpo_verl.algos.grouping import factorize_keys
from ebpo_verl.trainer.run_options import DBB, EBPO, SPO, RunOptions, StatefulEstimator, options_for_node

NAME = "ebpo"
PAD_PREFIX = "pad"
"""verl's padding rows have uids starting with it."""

ESTIMATOR_CLASSES: dict[str, type[Estimator]] = {
    NAME: EBPOEstimator,
    "bnpo": BNPOEstimator,
    "spo": SPOEstimator,
    "dbb": DBBEstimator,
}
"""The estimators that are objects (state, or diagnostics), by verl name; ``shrinkage_js`` is a pure function."""

DEFAULT_ESTIMATORS: dict[str, Estimator] = {name: cls() for name, cls in ESTIMATOR_CLASSES.items()}
"""The default instances: the estimators of stock ``verl.trainer.main_ppo`` in this process (and of any caller
of verl's registry, such as the CPU study), their options set from verl's node on each call. ``ebpo-train``'s
trainer never uses them: it owns its own (:func:`new_estimator`)."""


def new_estimator(options: RunOptions) -> Estimator | None:
    """A fresh estimator object for a run (None when ``options.adv_estimator`` is not one of ours with state or
    diagnostics: verl's own step runs it)."""
    cls = ESTIMATOR_CLASSES.get(options.adv_estimator)
    return None if cls is None else cls(options.estimator)


def default_estimator(entry: StatefulEstimator, config: Any) -> Estimator:
    """The default instance of ``entry``, with the options of verl's ``algorithm.<name>`` node (None -> defaults)."""
    estimator = DEFAULT_ESTIMATORS[entry.name]
    estimator.options = options_for_node(entry, None if config is None else config.get(entry.name, None))
    return estimator


def row_values(row_keys: Mapping[str, Any] | None, index: Any) -> np.ndarray | None:
    """Per-row values of a uid -> value map (None for uids it lacks: padding); None without a map."""
    if row_keys is None:
        return None
    uid_codes, uid_names = factorize_keys(np.asarray(index, dtype=object))
    per_uid = np.empty(len(uid_names), dtype=object)
    for i, name in enumerate(uid_names.tolist()):
        per_uid[i] = row_keys.get(name)
    return per_uid[uid_codes]


def outcome_advantages(
    estimate: Callable[..., Advantages],
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    values: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """An outcome estimator on verl's inputs: scores = summed token rewards; padding = an all-zero mask or a uid
    starting with ``pad``; ``values`` = the per-row field the estimator reads (labels, prompt keys). Returns
    (advantages, returns, diagnostics), the first two (bs, response_length): the row's advantage on each of its
    response tokens."""
    _check_shapes(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    result = estimate(scores, index, _has_response(response_mask), values, PAD_PREFIX)
    advantages = result.values.unsqueeze(-1) * response_mask
    return advantages, advantages, result.diagnostics


def _js(scores: torch.Tensor, index: Any, valid: torch.Tensor, values: Any, pad_prefix: str) -> Advantages:
    return compute_js_advantages(scores, index, valid, pad_prefix)


def compute_ebpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config: Any = None,
    labels: np.ndarray | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EBPO outcome advantage (arXiv 2602.05165): A_i = r_i - [(1 - S) mu_q + S mu_glob], batch-standardised.

    The response score is ``token_level_rewards.sum(-1)``; the options are those of ``config.ebpo`` (``config``
    is verl's ``algorithm`` node; None -> defaults); the running statistics are the default instance's
    (``DEFAULT_ESTIMATORS["ebpo"]``, also ``ebpo_verl.get_state()``). Rows whose uid starts with ``pad`` or whose
    response mask is all zero are padding: advantage 0, statistics untouched. ``labels`` (one per row) feed
    per-cluster priors when ``algorithm.ebpo.cluster_key`` is set.
    Returns (advantages, returns), both (bs, response_length).
    """
    advantages, returns, _ = outcome_advantages(
        default_estimator(EBPO, config), token_level_rewards, response_mask, index, labels
    )
    return advantages, returns


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
    :mod:`ebpo_verl.algos.baselines`). Padding rows (uid ``pad*`` or an all-zero mask) get 0 and enter no statistic.
    Returns (advantages, returns), both (bs, response_length).
    """
    advantages, returns, _ = outcome_advantages(_js, token_level_rewards, response_mask, index)
    return advantages, returns


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
    The ``bnpo/*`` diagnostics are the default instance's (``DEFAULT_ESTIMATORS["bnpo"].diagnostics``).
    Returns (advantages, returns), both (bs, response_length).
    """
    estimator = DEFAULT_ESTIMATORS["bnpo"]
    advantages, returns, _ = outcome_advantages(estimator, token_level_rewards, response_mask, index)
    return advantages, returns


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
    from (n0/2, n0/2). The tracker is the default instance's (``DEFAULT_ESTIMATORS["spo"]``), keyed by
    ``prompt_keys`` (one stable key per row, e.g. ``extra_info["index"]``); verl's uids are fresh every step, so
    without ``prompt_keys`` this raises rather than track nothing. Options: ``config.spo``.
    Returns (advantages, returns), both (bs, response_length).
    """
    advantages, returns, _ = outcome_advantages(
        default_estimator(SPO, config), token_level_rewards, response_mask, index, prompt_keys
    )
    return advantages, returns


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
    posteriors are the default instance's (``DEFAULT_ESTIMATORS["dbb"]``), keyed by ``prompt_keys`` (a stable key
    per row, as ``spo``'s); without them this raises. Options: ``config.dbb``. Returns (advantages, returns), both
    (bs, response_length).
    """
    advantages, returns, _ = outcome_advantages(
        default_estimator(DBB, config), token_level_rewards, response_mask, index, prompt_keys
    )
    return advantages, returns


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
