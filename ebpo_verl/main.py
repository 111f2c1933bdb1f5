"""Training entry point: ``python -m ebpo_verl.main [overrides]`` / ``ebpo-train [overrides]``.

verl's ``main_ppo`` flow with the package config (``config/ebpo_trainer.yaml``: verl's ``ppo_trainer`` plus the
EBPO deltas) and :class:`~ebpo_verl.trainer.EBPOTaskRunner`. ``--cfg job`` prints the composed config without
starting Ray. Configuration errors are reported before Ray starts, with exit status 2.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from ebpo_verl.validation import EBPOConfigError, check_config


@hydra.main(config_path="config", config_name="ebpo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """Validate the composed config, then train on the Ray cluster (local, or ``RAY_ADDRESS`` / ``ray_kwargs``)."""
    try:
        check_config(config)
    except EBPOConfigError as err:
        print(f"ebpo-train: error: {err}", file=sys.stderr)
        sys.exit(2)

    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from ebpo_verl.trainer import EBPOTaskRunner

    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=EBPOTaskRunner)


if __name__ == "__main__":
    main()
