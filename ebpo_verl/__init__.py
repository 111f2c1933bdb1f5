"""EBPO (Empirical-Bayes Policy Optimization) for verl 0.9.1.

Han et al., "EBPO: Empirical Bayes Shrinkage for Stabilizing Group-Relative Policy Optimization",
arXiv 2602.05165. The math lives in :mod:`ebpo_verl.algos` (torch only; the estimators' list is
:mod:`ebpo_verl.algos.registry`), the verl glue in :mod:`ebpo_verl.trainer` (verl loads its ``adapter`` through the
``verl.plugins`` entry point), TRL's in :mod:`ebpo_verl.integrations.trl`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ebpo_verl.version import __version__

if TYPE_CHECKING:
    from ebpo_verl.algos.ebpo_state import EBPOState

__all__ = ["__version__", "get_state", "register"]


def register() -> None:
    """Register every estimator of ours with verl (idempotent), raising on any failure: verl swallows entry-point
    plugins' errors, so call this where a silent failure would cost a rollout. Without the ``verl`` extra: refused in
    one line naming it."""
    from ebpo_verl.ops.extras import require

    require("verl", "the verl plugin (ebpo_verl.register)", "verl", "ray", "omegaconf")
    from ebpo_verl.trainer.adapter import register as _register

    _register()


def get_state() -> EBPOState:
    """The running EB statistics of this process's default ``ebpo`` instance: the estimator that verl's registry
    (stock ``verl.trainer.main_ppo``) uses; ``ebpo-train``'s trainer owns its own."""
    from ebpo_verl.trainer.adapter import DEFAULT_ESTIMATORS

    return DEFAULT_ESTIMATORS["ebpo"].state
