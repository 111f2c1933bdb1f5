"""verl glue: registers the ``ebpo`` advantage estimator (loaded by the ``verl.plugins`` entry point).

The same module registers the v2 draft's baselines ``shrinkage_js``, ``bnpo`` and ``spo`` (math in
:mod:`ebpo_verl.algos.baselines`) and Discounted Beta-Bernoulli ``dbb`` (math in :mod:`ebpo_verl.algos.dbb`).

verl calls an estimator with the rewards, the mask, the uids and its raw ``algorithm`` node only. Under
``ebpo-train`` the trainer hands each step's validated options and its uid -> ``extra_info`` value map (cluster
label, SPO prompt key) to the estimator through :func:`step_inputs` around verl's own advantage step, so the
estimator parses nothing per step. Under stock ``verl.trainer.main_ppo`` (no step inputs) the options come from
the node by value (:func:`ebpo_verl.trainer.run_options.options_for_node`: validated once per process and per value).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from ebpo_verl.algos.baselines import (
    compute_bnpo_advantages,
    compute_js_advantages,
    compute_spo_advantages,
)
from ebpo_verl.algos.dbb import compute_dbb_advantages
from ebpo_verl.algos.ebpo import compute_ebpo_advantages, factorize_keys, padding_names
from ebpo_verl.trainer.run_options import DBB, EBPO, SPO, StatefulEstimator, options_for_node

NAME = "ebpo"


@dataclass(frozen=True)
class StepInputs:
    """What the trainer knows of a step that verl's estimator call does not carry: the estimator's validated
    options and, when it reads a per-row field, ``uid -> extra_info[field]`` (padding uids absent)."""

    options: Any
    row_keys: Mapping[str, Any] | None = None


_STEP: contextvars.ContextVar[StepInputs | None] = contextvars.ContextVar("ebpo_step_inputs", default=None)


@contextlib.contextmanager
def step_inputs(inputs: StepInputs) -> Iterator[None]:
    """Make ``inputs`` what the estimator called inside the block reads (this thread / context only)."""
    token = _STEP.set(inputs)
    try:
        yield
    finally:
        _STEP.reset(token)


def _options(entry: StatefulEstimator, config: Any) -> tuple[Any, Mapping[str, Any] | None]:
    """(options, uid -> row key map or None) of this call: the trainer's step inputs, else the raw node's options."""
    inputs = _STEP.get()
    if inputs is not None and isinstance(inputs.options, entry.options_cls):
        return inputs.options, inputs.row_keys
    return options_for_node(entry, None if config is None else config.get(entry.name, None)), None


def _row_values(row_keys: Mapping[str, Any] | None, index: Any) -> np.ndarray | None:
    """Per-row values of a uid -> value map (None for uids it lacks: padding)."""
    if row_keys is None:
        return None
    uid_codes, uid_names = factorize_keys(np.asarray(index, dtype=object))
    per_uid = np.empty(len(uid_names), dtype=object)
    for i, name in enumerate(uid_names.tolist()):
        per_uid[i] = row_keys.get(name)
    return per_uid[uid_codes]


def _keyed_inputs(
    entry: StatefulEstimator, config: Any, index: Any, prompt_keys: np.ndarray | None, what: str
) -> tuple[Any, np.ndarray]:
    """(options, per-row stable prompt keys) of a per-prompt estimator (``spo``, ``dbb``): the given keys, else the
    step's uid -> key map; without either, ValueError (verl's uids are fresh every step, so nothing would recur)."""
    options, row_keys = _options(entry, config)
    if prompt_keys is None:
        prompt_keys = _row_values(row_keys, index)
    if prompt_keys is None:
        raise ValueError(
            f"adv_estimator={entry.name} needs a stable prompt key per row (verl's uid is drawn afresh every step, "
            f"so a uid-keyed {what} never sees a prompt twice): train with `python -m ebpo_verl.main`, which passes "
            f"extra_info[{options.prompt_key!r}] ({entry.section}.prompt_key), or pass prompt_keys=..."
        )
    return options, prompt_keys


def compute_ebpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config: Any = None,
    labels: np.ndarray | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EBPO outcome advantage (arXiv 2602.05165): A_i = r_i - [(1 - S) mu_q + S mu_glob], batch-standardised.

    The response score is ``token_level_rewards.sum(-1)``; the options are the trainer's (:func:`step_inputs`)
    or those of ``config.ebpo`` (``config`` is verl's ``algorithm`` node; None -> defaults); the running
    statistics are the process-wide ``ebpo_verl.get_state()``. Rows whose uid starts with ``pad`` or whose
    response mask is all zero are padding: advantage 0, statistics untouched. ``labels`` (one per row; by
    default the step's uid -> label map) feed per-cluster priors when ``algorithm.ebpo.cluster_key`` is set.
    Returns (advantages, returns), both (bs, response_length).
    """
    options, row_keys = _options(EBPO, config)
    if labels is None:
        labels = _row_values(row_keys, index)
    _check_shapes(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    valid = _has_response(response_mask)
    adv = compute_ebpo_advantages(scores, index, valid, options, EBPO.state, labels=labels, pad_prefix="pad")
    advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


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
    from (n0/2, n0/2). The tracker is ``ebpo_verl.algos.baselines.SPO_STATE``, keyed by ``prompt_keys`` (one stable
    key per row, e.g. ``extra_info["index"]``, which ``python -m ebpo_verl.main`` passes); verl's uids are fresh
    every step, so without ``prompt_keys`` (by default the step's uid -> key map) this raises rather than track
    nothing. Options: the trainer's (:func:`step_inputs`) or ``config.spo``.
    Returns (advantages, returns), both (bs, response_length).
    """
    options, prompt_keys = _keyed_inputs(SPO, config, index, prompt_keys, "tracker")
    _check_shapes(token_level_rewards, response_mask)
    valid = _unpadded(response_mask, index)
    adv = compute_spo_advantages(token_level_rewards.sum(dim=-1), prompt_keys, valid, options, SPO.state)
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
    posteriors are ``ebpo_verl.algos.dbb.DBB_STATE``, keyed by ``prompt_keys`` (a stable key per row, as ``spo``'s);
    without them (by default the step's uid -> key map) this raises. Options: the trainer's (:func:`step_inputs`) or
    ``config.dbb``. Returns (advantages, returns), both (bs, response_length).
    """
    options, prompt_keys = _keyed_inputs(DBB, config, index, prompt_keys, "posterior")
    _check_shapes(token_level_rewards, response_mask)
    adv = compute_dbb_advantages(
        token_level_rewards.sum(dim=-1), prompt_keys, _unpadded(response_mask, index), options, DBB.state
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
