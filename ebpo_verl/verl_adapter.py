"""verl glue: registers the ``ebpo`` advantage estimator (loaded by the ``verl.plugins`` entry point)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from ebpo_verl.estimator import GLOBAL_STATE, EBPOOptions, compute_ebpo_advantages

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
    verl's ``algorithm`` node; None -> defaults); the running statistics are the process-wide
    ``ebpo_verl.get_state()``. Rows whose uid starts with ``pad`` or whose response mask is all zero are padding:
    advantage 0, statistics untouched. ``labels`` (one per row) feed per-cluster priors when
    ``algorithm.ebpo.cluster_key`` is set. Returns (advantages, returns), both (bs, response_length).
    """
    options = EBPOOptions.from_mapping(None if config is None else config.get("ebpo", None))
    scores = token_level_rewards.sum(dim=-1)
    uids = np.asarray(index).astype(str)
    is_pad = torch.from_numpy(np.char.startswith(uids, "pad")).to(response_mask.device)
    valid = _has_response(response_mask) & ~is_pad
    adv = compute_ebpo_advantages(scores, uids, valid.cpu(), options, GLOBAL_STATE, labels=labels)
    advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


def _has_response(response_mask: torch.Tensor) -> torch.Tensor:
    """Rows with at least one response token; reads whole rows only where the first token is masked out."""
    has = response_mask[:, 0] != 0
    unsure = torch.nonzero(~has).squeeze(-1)
    if unsure.numel():
        has.index_copy_(0, unsure, response_mask.index_select(0, unsure).ne(0).any(dim=-1))
    return has


def register() -> None:
    """Register ``ebpo`` in verl's estimator registry; idempotent (same function object every time)."""
    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    current = registry.get(NAME)
    ours = compute_ebpo_outcome_advantage
    if current is not None and current is not ours and _same_definition(current, ours):
        del registry[NAME]  # this module was executed again (reload, second import name): replace our old copy
    if registry.get(NAME) is not ours:
        core_algos.register_adv_est(NAME)(ours)
    if core_algos.get_adv_estimator_fn(NAME) is not compute_ebpo_outcome_advantage:
        raise RuntimeError(f"verl's registry holds a different '{NAME}' estimator")


def _same_definition(a: Any, b: Any) -> bool:
    """True when ``a`` is the same function from another execution of this file (reload, path import)."""
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return code_a is not None and (a.__qualname__, code_a.co_filename) == (b.__qualname__, code_b.co_filename)


register()
