"""verl glue: registers every estimator of ours (:func:`ebpo_verl.algos.registry.ours`) in verl's registry (loaded
by the ``verl.plugins`` entry point).

Each estimator of ours is an object (:class:`ebpo_verl.algos.estimator.Estimator`: options, state, diagnostics),
while verl hands a registered estimator only the batch tensors and its raw ``algorithm`` node. Both ways in go
through :func:`outcome_advantages` (verl's tensors -> scores, padding, broadcast):

- ``ebpo-train``: the trainer owns the run's object; its copy of verl's advantage step
  (``ebpo_verl.trainer.ray_trainer.copied_compute_advantage``) calls :func:`advantage_step` with it where verl
  would call the registered function, so the call site shows whose state changes and no more of verl is copied.
  The CPU study does the same with its own objects.
- stock ``verl.trainer.main_ppo``: the registered functions (:func:`registered_function`) use
  :data:`DEFAULT_ESTIMATORS`, options from the node by value (:func:`ebpo_verl.trainer.run_options.options_for_node`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos

from ebpo_verl.algos import registry
from ebpo_verl.algos.estimator import Advantages, Estimator
from ebpo_verl.algos.registry import EstimatorSpec
from ebpo_verl.compat import trl_probe
from ebpo_verl.trainer.run_options import options_for_node

PAD_PREFIX = "pad"
"""verl's padding rows have uids starting with it."""

DEFAULT_ESTIMATORS: dict[str, Estimator] = {
    name: registry.new_estimator(spec) for name, spec in registry.ours().items()
}
"""This process's default instance of each estimator of ours, which stock ``verl.trainer.main_ppo`` runs (options
from verl's node on each call); ``ebpo-train``, TRL and the CPU study own their own."""


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
    shape, mask_shape = tuple(token_level_rewards.shape), tuple(response_mask.shape)
    if len(shape) != 2 or mask_shape != shape or shape[1] == 0:
        raise ValueError(
            "advantage estimators need token_level_rewards and response_mask of one shape (bs, response_length) with "
            f"response_length >= 1; got {shape} and {mask_shape}"
        )
    scores = token_level_rewards.sum(dim=-1)
    result = estimate(scores, index, _has_response(response_mask), values, PAD_PREFIX)
    advantages = result.values.unsqueeze(-1) * response_mask
    return advantages, advantages, result.diagnostics


def advantage_step(
    data: DataProto, estimator: Estimator, row_values: np.ndarray | None = None
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """The one advantage step on verl's batch: ``estimator`` (the run's object) on ``data``'s
    ``token_level_rewards``, ``response_mask`` and ``uid`` with ``row_values``, what it reads per row
    (its spec's ``row_source``). Returns (advantages, returns, diagnostics)."""
    batch = data.batch
    uids = data.non_tensor_batch["uid"]
    return outcome_advantages(estimator, batch["token_level_rewards"], batch["response_mask"], uids, row_values)


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


REGISTERED_DOC = """

Args: ``token_level_rewards`` and ``response_mask`` (bs, response_length), the score of a response being its summed
token rewards; ``index`` the rows' prompt uids (a uid starting with ``pad`` or an all-zero mask: padding, advantage
0, no statistic touched); ``config`` verl's ``algorithm`` node (the options are its ``algorithm.<name>``, None ->
defaults); ``{kwarg}`` one value per row of the ``extra_info`` field the options name (``{row_key}``).
Returns (advantages, returns), both (bs, response_length): the row's advantage on each of its response tokens.
Under stock ``main_ppo`` the state and diagnostics are this process's default instance's
(``ebpo_verl.trainer.adapter.DEFAULT_ESTIMATORS``); ``ebpo-train`` calls the run's own object instead."""


def registered_function(spec: EstimatorSpec) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """``spec``'s function for verl's registry (stock ``main_ppo``'s way in), its docstring from the registry."""

    def compute(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: np.ndarray,
        config: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        values = kwargs.get(spec.row_kwarg) if spec.row_key else None
        estimate = DEFAULT_ESTIMATORS[spec.name]  # with the options of verl's algorithm.<name> node (None: defaults)
        if spec.options_cls is not None:
            estimate.options = options_for_node(spec, None if config is None else config.get(spec.name, None))
        advantages, returns, _ = outcome_advantages(estimate, token_level_rewards, response_mask, index, values)
        return advantages, returns

    compute.__name__ = compute.__qualname__ = f"compute_{spec.name}_outcome_advantage"
    compute.__doc__ = f"{spec.summary} ({spec.source})." + REGISTERED_DOC.format(
        kwarg=spec.row_kwarg if spec.row_key else "(no per-row field)", row_key=spec.row_key or "none"
    )
    return compute


ESTIMATORS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    spec.registered_name: registered_function(spec) for spec in registry.ours().values()
}
"""Every estimator this package registers in verl, by its verl name."""


def register() -> None:
    """Register every estimator of ours (:data:`ESTIMATORS`) in verl's estimator registry; idempotent."""
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
trl_probe.install()  # verl's model building beside TRL 1.x (ebpo_verl.compat.trl_probe)
