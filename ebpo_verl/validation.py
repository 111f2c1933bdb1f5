"""Pre-flight checks of an EBPO run: everything that would otherwise fail after a full rollout, or silently.

``check_config`` runs in the driver before Ray starts; ``check_registered`` and ``check_cluster_labels`` run in
the TaskRunner (where the estimator is called and the training dataset is loaded), before the first rollout.
All of them raise :class:`EBPOConfigError` with a message naming the offending key/value and the fix.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from typing import Any

from ebpo_verl.estimator import EBPOOptions

ESTIMATOR = "ebpo"


class EBPOConfigError(ValueError):
    """A configuration or data problem found before the first rollout."""


def is_ebpo(config: Any) -> bool:
    """True when the run uses the EBPO estimator (``algorithm.adv_estimator=ebpo``)."""
    return str(config.algorithm.adv_estimator) == ESTIMATOR


def ebpo_options(config: Any) -> EBPOOptions:
    """``algorithm.ebpo`` as validated :class:`EBPOOptions` (unknown keys / bad values -> EBPOConfigError)."""
    try:
        return EBPOOptions.from_mapping(config.algorithm.get("ebpo", None))
    except (TypeError, ValueError) as err:
        raise EBPOConfigError(str(err)) from err


def check_config(config: Any) -> EBPOOptions | None:
    """Driver-side checks of the composed config; returns the EBPO options (None for other estimators).

    - ``trainer.use_v1`` must be true (the legacy ``RayPPOTrainer`` has no hook for labels or metrics);
    - ``algorithm.ebpo`` must hold only known keys with valid values;
    - ``shrinkage=auto`` needs ``actor_rollout_ref.rollout.n >= 2`` (the within-group variance needs two samples);
    - the curriculum options (``ebpo_verl.curriculum``) must be consistent with ``data.shuffle``.
    """
    if not bool(config.trainer.get("use_v1", True)):
        raise EBPOConfigError(
            "trainer.use_v1=false (verl's legacy RayPPOTrainer) is not supported by ebpo-train: its fit() loop "
            "offers no hook to pass cluster labels to the estimator or to log the ebpo/* metrics. "
            "Use the default trainer.use_v1=true."
        )
    _check_curriculum(config.data)
    if not is_ebpo(config):
        return None
    options = ebpo_options(config)
    n = int(config.actor_rollout_ref.rollout.n)
    if n < 2 and options.fixed_shrinkage is None:
        raise EBPOConfigError(
            f"actor_rollout_ref.rollout.n={n} but algorithm.ebpo.shrinkage=auto needs at least 2 responses per "
            "prompt to estimate the within-group variance. Set actor_rollout_ref.rollout.n>=2, or fix the "
            "shrinkage (e.g. algorithm.ebpo.shrinkage=1.0 for a global-mean baseline)."
        )
    return options


def _check_curriculum(data_config: Any) -> None:
    from ebpo_verl.curriculum import validate_curriculum_config

    try:
        validate_curriculum_config(data_config)
    except ValueError as err:
        raise EBPOConfigError(str(err)) from err


def check_registered() -> None:
    """Make sure ``ebpo`` is in verl's estimator registry of *this* process (the TaskRunner actor).

    verl's plugin loader swallows import errors, which would otherwise surface as "Unknown advantage estimator"
    after the first rollout.
    """
    from verl.trainer.ppo import core_algos

    try:
        import ebpo_verl

        ebpo_verl.register()
        core_algos.get_adv_estimator_fn(ESTIMATOR)
    except Exception as err:
        raise EBPOConfigError(
            f"advantage estimator '{ESTIMATOR}' is not registered in the TaskRunner process "
            f"(pid {os.getpid()} on {socket.gethostname()}): {type(err).__name__}: {err}. "
            "Install ebpo-verl (pip install -e .) in the Python environment of every Ray node."
        ) from err


def check_cluster_labels(extra_infos: Iterable[Mapping[str, Any] | None], cluster_key: str, source: str) -> None:
    """Every training row must carry ``extra_info[cluster_key]`` (not null); else list what the rows do have.

    Args:
        extra_infos: the ``extra_info`` of each training row, in dataset order.
        cluster_key: ``algorithm.ebpo.cluster_key``.
        source: where the rows come from (the data files), for the message.
    """
    existing: set[str] = set()
    missing: list[int] = []
    rows = 0
    for row, info in enumerate(extra_infos):
        rows += 1
        info = info or {}
        existing.update(str(k) for k in info)
        if info.get(cluster_key) is None:
            missing.append(row)
    if not missing:
        return
    if cluster_key not in existing:
        raise EBPOConfigError(
            f"algorithm.ebpo.cluster_key={cluster_key!r} is not a key of extra_info in the training data "
            f"({source}); extra_info keys present: {sorted(existing) or 'none'}. Pick one of them, or add the "
            "labels to the data (data_prep), or set algorithm.ebpo.cluster_key=null."
        )
    raise EBPOConfigError(
        f"extra_info[{cluster_key!r}] is missing or null in {len(missing)} of {rows} training rows ({source}); "
        f"first rows: {missing[:10]}. Every prompt needs a cluster label: fix the data (data_prep)."
    )
