"""Pre-flight checks that read only the composed config (and verl's own ``validate_config``); each takes
``(config, options, dry_run)`` and returns a line for the log or None (:data:`ebpo_verl.trainer.preflight.CHECKS`)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import warnings
from typing import Any

from omegaconf import OmegaConf, open_dict

from ebpo_verl.algos import registry
from ebpo_verl.ops.errors import EBPOConfigError, one_line, shorten
from ebpo_verl.reward import RewardOptions
from ebpo_verl.trainer.run_options import RunOptions

POSITIVE_INT_KEYS = (
    "actor_rollout_ref.rollout.n",
    "data.train_batch_size",
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
)
SHAPED_REWARD_KEYS = {
    "algorithm.use_kl_in_reward": "subtracts a per-token KL penalty from the reward",
    "reward.reward_kwargs.overlong_buffer_cfg.enable": "adds DAPO's overlong-length penalty",
    "reward.reward_model.enable": "scores with a learned reward model",
}
"""Config switches that make the reward take more than two values (EBPO-BB needs 0/1 or -1/+1)."""
LEGACY_REWARD_KEYS = {
    "reward_model.enable": "reward.reward_model.enable",
    "reward_model.enable_resource_pool": "reward.reward_model.enable_resource_pool",
    "reward_model.n_gpus_per_node": "reward.reward_model.n_gpus_per_node",
    "reward_model.nnodes": "reward.reward_model.nnodes",
    "reward_model.num_workers": "reward.num_workers",
    "reward_model.reward_manager": "reward.reward_manager.name",
    "reward_model.model.path": "reward.reward_model.model_path",
    "reward_model.reward_kwargs": "reward.reward_kwargs",
    "custom_reward_function.path": "reward.custom_reward_function.path",
    "custom_reward_function.name": "reward.custom_reward_function.name",
}
"""verl 0.9.1's legacy reward keys (``legacy_reward_impl.yaml``, all null by default) -> the keys that replaced them
(``migrate_legacy_reward_impl``, which only verl's experimental fully-async entry point calls: ``main_ppo`` ignores
a legacy key silently)."""
OUR_REWARD = "pkg://ebpo_verl.reward"
"""``reward.custom_reward_function.path`` of the reward whose knobs (:class:`~ebpo_verl.reward.RewardOptions`) the
driver resolves into ``reward_kwargs``."""


def check_positive_ints(config: Any) -> None:
    """The group size, batch size and cluster size (and ``data.gen_batch_size`` when set) are positive integers."""
    keys = POSITIVE_INT_KEYS + (("data.gen_batch_size",) if OmegaConf.select(config, "data.gen_batch_size") else ())
    for key in keys:
        value = OmegaConf.select(config, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise EBPOConfigError(f"{key}={value!r} is invalid; use a positive integer")


def check_v1_trainer(config: Any, options: RunOptions, dry_run: bool) -> None:
    """``trainer.use_v1`` must be true (the legacy ``RayPPOTrainer`` has no hook for labels or metrics)."""
    if not bool(config.trainer.get("use_v1", True)):
        raise EBPOConfigError(
            "trainer.use_v1=false (verl's legacy RayPPOTrainer) is not supported by ebpo-train: its fit() loop "
            "offers no hook to pass cluster labels to the estimator or to log the ebpo/* metrics. "
            "Use the default trainer.use_v1=true."
        )


def check_stock_verl_methods(config: Any, options: RunOptions, dry_run: bool) -> None:
    """What verl 0.9.1 rejects only at run time for an estimator whose spec reads the actor's sum of squared token
    probabilities (``sum_pi_squared``: its Optimal Token Baseline) and its KL-Cov loss: the sum not computed (an
    assert on the first advantage step), fused kernels (the engines raise NotImplementedError: they never
    materialise the logits the sum needs) or the rollout correction's bypass mode (no old-log-prob pass, so no sum);
    KL-Cov with a non-positive ``kl_cov_ratio``."""
    actor = config.actor_rollout_ref.actor
    estimator = options.adv_estimator
    if (spec := registry.by_verl_name(estimator)) is not None and spec.sum_pi_squared:
        if not bool(actor.get("calculate_sum_pi_squared", False)):
            raise EBPOConfigError(
                f"algorithm.adv_estimator={estimator} needs actor_rollout_ref.actor.calculate_sum_pi_squared=True "
                "(the sum of squared token probabilities it weights by; verl asserts on the first step otherwise)"
            )
        if bool(OmegaConf.select(config, "actor_rollout_ref.model.use_fused_kernels", default=False)):
            raise EBPOConfigError(
                f"algorithm.adv_estimator={estimator} cannot run with actor_rollout_ref.model.use_fused_kernels=True "
                "(fused kernels never materialise the logits the sum of squared probabilities needs): set it False"
            )
        if bool(OmegaConf.select(config, "algorithm.rollout_correction.bypass_mode", default=False)):
            raise EBPOConfigError(
                f"algorithm.adv_estimator={estimator} needs the actor's old-log-prob pass, which "
                "algorithm.rollout_correction.bypass_mode=True skips (no sum of squared probabilities): set it False"
            )
    policy_loss = actor.get("policy_loss", None) or {}
    if policy_loss.get("loss_mode", None) == "kl_cov" and not float(policy_loss.get("kl_cov_ratio", 0.0002)) > 0:
        raise EBPOConfigError(
            f"actor_rollout_ref.actor.policy_loss.kl_cov_ratio={policy_loss.get('kl_cov_ratio')} must be > 0 for "
            "loss_mode=kl_cov (the share of tokens it penalises; the Entropy Mechanism paper uses 0.002)"
        )


def check_group_size(config: Any, options: RunOptions, dry_run: bool) -> None:
    """An estimator whose spec needs ``actor_rollout_ref.rollout.n >= 2`` (``min_group``: EBPO's group-mean baseline,
    ``jspo_history``, ``jspo`` form=authors_code) gets it."""
    spec, n = options.spec, int(config.actor_rollout_ref.rollout.n)
    why = spec.min_group(options.estimator) if spec is not None and n < 2 else None
    if why:
        raise EBPOConfigError(
            f"actor_rollout_ref.rollout.n={n} but algorithm.adv_estimator={spec.name} needs at least 2 responses per "
            f"prompt ({why}). Set actor_rollout_ref.rollout.n>=2."
        )


def check_shaped_rewards(config: Any, options: RunOptions, dry_run: bool) -> None:
    """An estimator that reads rewards as pass rates (its spec's ``pass_rates``: ``bnpo``, ``dbb``, ``ha_dw``,
    EBPO-BB) refuses every switch that shapes the reward (:data:`SHAPED_REWARD_KEYS`)."""
    spec = options.spec
    why = spec.pass_rates(options.estimator) if spec is not None else None
    if not why:
        return
    for key, effect in SHAPED_REWARD_KEYS.items():
        if bool(OmegaConf.select(config, key, default=False)):
            raise EBPOConfigError(
                f"algorithm.adv_estimator={spec.name} needs rewards in [0, 1] or the paper's -1/+1 ({why}), but "
                f"{key}=True {effect}, so rewards take other values. Set {key}=False, or use another estimator."
            )


def check_legacy_reward_keys(config: Any, options: RunOptions, dry_run: bool) -> None:
    """A legacy reward key set (:data:`LEGACY_REWARD_KEYS`), which verl 0.9.1's ``main_ppo`` would ignore, is
    refused naming the key that replaced it."""
    for key, replacement in LEGACY_REWARD_KEYS.items():
        value = OmegaConf.select(config, key, default=None)
        if value is not None:
            raise EBPOConfigError(
                f"{key}={shorten(value)} is verl's legacy reward key, which verl 0.9.1's trainer ignores: set "
                f"{replacement} instead"
            )


def warn_filtered_groups(config: Any, options: RunOptions, dry_run: bool) -> None:
    """DAPO's dynamic sampling (``algorithm.filter_groups.enable``) with a stateful estimator: verl drops the
    all-pass and all-fail groups before the advantage step, so the estimator's state never sees them."""
    spec = options.stateful
    if spec is not None and bool(OmegaConf.select(config, "algorithm.filter_groups.enable", default=False)):
        print(
            f"ebpo-train: warning: algorithm.filter_groups.enable=True drops every all-pass and all-fail group "
            f"before the advantage step: the {spec.name} estimator's running state never sees them, only the mixed "
            "groups (docs/estimator.md)",
            file=sys.stderr,
        )


def warn_ignored_options(config: Any, options: RunOptions, dry_run: bool) -> None:
    """Name the run's estimator options set away from their defaults that its mode ignores (its spec's
    ``warning``; under stock ``main_ppo``, :func:`~ebpo_verl.trainer.run_options.options_for_node` warns)."""
    spec = options.spec
    if spec is not None and (warning := spec.warning_of(options.estimator)):
        print(f"ebpo-train: warning: {warning}", file=sys.stderr)


def warn_versions(config: Any, options: RunOptions, dry_run: bool) -> None:
    """The running library versions against recipe/ebpo/VERSIONS.txt (:func:`ebpo_verl.ops.provenance.version_warning`);
    a malformed file is an error naming its line."""
    from ebpo_verl.ops.provenance import version_warning

    try:
        versions = version_warning()
    except ValueError as err:
        raise EBPOConfigError(str(err)) from err
    if versions:
        print(f"ebpo-train: warning: {versions}", file=sys.stderr)


def check_verl_config(config: Any, options: Any = None, dry_run: bool = False) -> str:
    """verl's own ``validate_config`` (what ``main_ppo`` runs before Ray) at the configured world size.

    It reads only the config (batch sizes vs world size, micro-batch settings, ...), so it runs on a machine
    without GPUs. Its progress lines go to stderr, keeping stdout for ``--cfg job``'s config.
    """
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    size = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    try:
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Disabled critic")  # need_critic's note for every non-GAE run
            validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except Exception as err:  # verl reports with assert, ValueError and hydra's InstantiationException
        reason = err.__cause__ if err.__cause__ is not None else err
        raise EBPOConfigError(
            f"verl's validate_config refused the config at world size {size} (trainer.nnodes="
            f"{config.trainer.nnodes} x trainer.n_gpus_per_node={config.trainer.n_gpus_per_node}): {one_line(reason)}"
        ) from err
    return f"world size {size}"


def check_resume(config: Any, options: RunOptions, dry_run: bool) -> str | None:
    """The checkpoint a resume will load, checked against the estimator's options on the driver
    (:func:`ebpo_verl.trainer.checkpoint.resume.check_resume`): a mismatch under ``on_resume_mismatch=error`` or an
    unreadable state file stops here, before Ray starts and weights load."""
    from ebpo_verl.trainer.checkpoint.resume import check_resume as check

    try:
        return check(config.trainer, options)
    except ValueError as err:
        raise EBPOConfigError(str(err)) from err


def reward_options(config: Any) -> RewardOptions | None:
    """The reward's knobs of a run graded by :data:`OUR_REWARD`: ``reward_kwargs.workers`` / ``.timeout`` (absent:
    the declared defaults), each ``EBPO_REWARD_*`` variable set here replacing its key (the environment read once,
    here); None for another reward (whose ``reward_kwargs`` are its own), the variables checked all the same.
    EBPOConfigError naming the key or the variable."""
    try:
        from_env = RewardOptions.env_values(os.environ)
        if OmegaConf.select(config, "reward.custom_reward_function.path") != OUR_REWARD:
            return None
        given = OmegaConf.select(config, RewardOptions.SECTION) or {}
        return RewardOptions.from_mapping({**{k: given[k] for k in RewardOptions.keys() if k in given}, **from_env})
    except ValueError as err:
        raise EBPOConfigError(str(err)) from err


def check_reward_options(config: Any, options: RunOptions, dry_run: bool) -> None:
    """The reward's knobs are valid (:func:`reward_options`): a bad one stops here, not in a reward worker."""
    reward_options(config)


def resolve_reward_options(config: Any) -> None:
    """In the driver, before Ray starts: the reward's resolved knobs written into ``reward_kwargs`` (verl passes
    them to every ``compute_score`` call; the driver's environment does not reach Ray's reward workers)."""
    resolved = reward_options(config)
    if resolved is not None:
        with open_dict(config):
            OmegaConf.update(config, RewardOptions.SECTION, dataclasses.asdict(resolved), merge=True)
