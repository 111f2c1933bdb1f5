"""The estimator name against verl's registry: in the driver (the name exists) and in the TaskRunner (ours is
registered in that process; verl's plugin loader swallows import errors, which would otherwise surface as
"Unknown advantage estimator" after the first rollout)."""

from __future__ import annotations

import os
import socket
from typing import Any

from ebpo_verl.ops.errors import EBPOConfigError


def check_estimator_name(config: Any, options: Any = None, dry_run: bool = False) -> None:
    """``algorithm.adv_estimator`` must be registered in verl after ``ebpo_verl.register()``; else list the names."""
    from verl.trainer.ppo import core_algos

    from ebpo_verl.trainer.adapter import register

    register()
    name = str(config.algorithm.adv_estimator)
    known = sorted(core_algos.ADV_ESTIMATOR_REGISTRY)
    if name not in known:
        raise EBPOConfigError(
            f"algorithm.adv_estimator={name!r} is not an advantage estimator known to verl or ebpo-verl; "
            f"known: {', '.join(known)}"
        )


def check_registered(name: str) -> None:
    """Make sure ``name`` (an estimator of ours) is in verl's registry of *this* process (the TaskRunner actor)."""
    from verl.trainer.ppo import core_algos

    try:
        from ebpo_verl.trainer.adapter import register

        register()
        core_algos.get_adv_estimator_fn(name)
    except Exception as err:
        raise EBPOConfigError(
            f"advantage estimator '{name}' is not registered in the TaskRunner process "
            f"(pid {os.getpid()} on {socket.gethostname()}): {type(err).__name__}: {err}. "
            "Install ebpo-verl (pip install -e .) in the Python environment of every Ray node."
        ) from err
