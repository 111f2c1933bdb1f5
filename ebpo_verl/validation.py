"""Pre-flight checks of an EBPO run: everything that would otherwise fail after a full rollout, or silently.

``preflight`` runs in the driver before Ray starts, for a real run and for ``--cfg job`` alike: ``check_config``
(ours), ``check_verl_config`` (verl's ``validate_config`` at the configured world size) and
``check_steps_per_epoch``. ``check_registered`` and ``check_cluster_labels`` run in the TaskRunner (where the
estimator is called and the training dataset is loaded), before the first rollout. All of them raise
:class:`EBPOConfigError` with a message naming the offending key/value and the fix.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from omegaconf import OmegaConf

from ebpo_verl.baselines import SPO_OPTION_KEYS, SPOOptions
from ebpo_verl.estimator import OPTION_KEYS, EBPOOptions, ignored_options, is_missing_label, parsed_options
from ebpo_verl.estimator import unknown_option_message as _unknown_option_message

ESTIMATOR = "ebpo"
SPO = "spo"


class EBPOConfigError(ValueError):
    """A configuration or data problem found before the first rollout."""


def is_ebpo(config: Any) -> bool:
    """True when the run uses the EBPO estimator (``algorithm.adv_estimator=ebpo``)."""
    return str(config.algorithm.adv_estimator) == ESTIMATOR


def is_spo(config: Any) -> bool:
    """True when the run uses the SPO baseline (``algorithm.adv_estimator=spo``), whose tracker needs prompt keys."""
    return str(config.algorithm.adv_estimator) == SPO


def _options_section(config: Any, name: str, valid: Iterable[str]) -> Mapping[str, Any] | None:
    """``algorithm.<name>``: a mapping of options or null; anything else (``algorithm.ebpo=5``) -> one-line error."""
    mapping = config.algorithm.get(name, None)
    if mapping is not None and not isinstance(mapping, Mapping):
        raise EBPOConfigError(
            f"algorithm.{name}={mapping!r} is not a mapping of options: set each option on its own, "
            f"algorithm.{name}.<option>=<value>, with <option> one of {', '.join(valid)}"
        )
    return mapping


def spo_options(config: Any) -> SPOOptions:
    """``algorithm.spo`` as validated :class:`~ebpo_verl.baselines.SPOOptions` (bad keys/values -> EBPOConfigError)."""
    mapping = _options_section(config, "spo", SPO_OPTION_KEYS)
    try:
        return parsed_options(SPOOptions, mapping)
    except (TypeError, ValueError) as err:
        raise EBPOConfigError(str(err)) from err


def ebpo_options(config: Any) -> EBPOOptions:
    """``algorithm.ebpo`` as validated :class:`EBPOOptions` (unknown keys / bad values -> EBPOConfigError)."""
    mapping = _options_section(config, "ebpo", OPTION_KEYS)
    try:
        return parsed_options(EBPOOptions, mapping)
    except (TypeError, ValueError) as err:
        raise EBPOConfigError(str(err)) from err


def check_config(config: Any) -> EBPOOptions | None:
    """Driver-side checks of the composed config; returns the EBPO options (None for other estimators).

    - ``trainer.use_v1`` must be true (the legacy ``RayPPOTrainer`` has no hook for labels or metrics);
    - ``algorithm.ebpo`` must hold only known keys with valid values;
    - ``shrinkage=auto`` needs ``actor_rollout_ref.rollout.n >= 2`` (the within-group variance needs two samples);
    - the curriculum options (``ebpo_verl.curriculum``) must be consistent with ``data.shuffle``;
    - the group size, batch size and cluster size must be positive integers (``POSITIVE_INT_KEYS``).
    """
    for key in POSITIVE_INT_KEYS:
        _check_positive_int(config, key)
    if OmegaConf.select(config, "data.gen_batch_size") is not None:
        _check_positive_int(config, "data.gen_batch_size")
    if not bool(config.trainer.get("use_v1", True)):
        raise EBPOConfigError(
            "trainer.use_v1=false (verl's legacy RayPPOTrainer) is not supported by ebpo-train: its fit() loop "
            "offers no hook to pass cluster labels to the estimator or to log the ebpo/* metrics. "
            "Use the default trainer.use_v1=true."
        )
    _check_curriculum(config.data)
    if is_spo(config):
        spo_options(config)
    if str(config.algorithm.adv_estimator) == "bnpo":
        _check_bnpo_reward(config)
    _check_stock_verl_methods(config)
    if not is_ebpo(config):
        return None
    options = ebpo_options(config)
    n = int(config.actor_rollout_ref.rollout.n)
    if n < 2 and options.fixed_shrinkage == 0:
        raise EBPOConfigError(
            f"actor_rollout_ref.rollout.n={n} with algorithm.ebpo.shrinkage=0: the baseline is the group mean, "
            "which for one response is the response itself, so every advantage is 0. Set "
            "actor_rollout_ref.rollout.n>=2."
        )
    if n < 2 and options.fixed_shrinkage is None:
        raise EBPOConfigError(
            f"actor_rollout_ref.rollout.n={n} but algorithm.ebpo.shrinkage=auto needs at least 2 responses per "
            "prompt to estimate the within-group variance. Set actor_rollout_ref.rollout.n>=2, or fix the "
            "shrinkage (e.g. algorithm.ebpo.shrinkage=1.0 for a global-mean baseline)."
        )
    if options.prior == "beta_binomial":
        _check_two_level_reward(config)
    return options


OTB_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")


def _check_stock_verl_methods(config: Any) -> None:
    """What verl 0.9.1 rejects only at run time for its Optimal Token Baseline and KL-Cov loss: OTB without the
    actor's sum of squared token probabilities (an assert on the first advantage step) or with fused kernels
    (the engines raise NotImplementedError: they never materialise the logits Σπ² needs) or with the rollout
    correction's bypass mode (no old-log-prob pass, so no Σπ²); KL-Cov with a
    non-positive ``kl_cov_ratio`` (an assert in the loss)."""
    actor = config.actor_rollout_ref.actor
    estimator = str(config.algorithm.adv_estimator)
    if estimator in OTB_ESTIMATORS:
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


SHAPED_REWARD_KEYS = {
    "algorithm.use_kl_in_reward": "subtracts a per-token KL penalty from the reward",
    "reward.reward_kwargs.overlong_buffer_cfg.enable": "adds DAPO's overlong-length penalty",
    "reward.reward_model.enable": "scores with a learned reward model",
}
"""Config switches that make the reward take more than two values (EBPO-BB needs 0/1 or -1/+1)."""


def _check_two_level_reward(config: Any) -> None:
    for key, effect in SHAPED_REWARD_KEYS.items():
        if bool(OmegaConf.select(config, key, default=False)):
            raise EBPOConfigError(
                f"algorithm.ebpo.prior=beta_binomial needs a two-level reward (0/1, or the paper's -1/+1), but "
                f"{key}=True {effect}, so rewards take other values. Set {key}=False, or use "
                "algorithm.ebpo.prior=gaussian."
            )


def _check_bnpo_reward(config: Any) -> None:
    for key in ("algorithm.use_kl_in_reward", "reward.reward_kwargs.overlong_buffer_cfg.enable"):
        if bool(OmegaConf.select(config, key, default=False)):
            raise EBPOConfigError(
                f"algorithm.adv_estimator=bnpo needs rewards in [0, 1] or the paper's -1/+1 (it fits a Beta "
                f"distribution to pass rates), but {key}=True {SHAPED_REWARD_KEYS[key]}, so rewards take other "
                f"values. Set {key}=False, or use another estimator."
            )


def ignored_options_warning(options: EBPOOptions) -> str | None:
    """One line naming the ``algorithm.ebpo`` options set away from their defaults that the chosen mode ignores."""
    ignored = ignored_options(options)
    if not ignored:
        return None
    mode = (
        f"stats_scope={options.stats_scope}, prior={options.prior}, shrinkage={options.shrinkage}, "
        f"norm={options.norm}, cluster_key={options.cluster_key or 'null'}"
    )
    return f"algorithm.ebpo option(s) {', '.join(ignored)} have no effect with {mode}"


def unknown_option_message(key: str, section: str = "algorithm.ebpo") -> str:
    """:func:`ebpo_verl.estimator.unknown_option_message` for ``algorithm.ebpo`` or ``algorithm.spo``."""
    return _unknown_option_message(key, section, SPO_OPTION_KEYS if section == "algorithm.spo" else OPTION_KEYS)


POSITIVE_INT_KEYS = (
    "actor_rollout_ref.rollout.n",
    "data.train_batch_size",
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
)


def _check_positive_int(config: Any, key: str) -> None:
    value = OmegaConf.select(config, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EBPOConfigError(f"{key}={value!r} is invalid; use a positive integer")


def world_size(config: Any) -> int:
    """GPUs of the run: ``trainer.nnodes x trainer.n_gpus_per_node``."""
    return int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)


def check_verl_config(config: Any) -> None:
    """verl's own ``validate_config`` (what ``main_ppo`` runs before Ray) at the configured world size.

    It reads only the config (batch sizes vs world size, micro-batch settings, ...), so it runs on a machine
    without GPUs. Its progress lines go to stderr, keeping stdout for ``--cfg job``'s config.
    """
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Disabled critic")  # need_critic's note for every non-GAE run
            validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except Exception as err:  # verl reports with assert, ValueError and hydra's InstantiationException
        reason = err.__cause__ if err.__cause__ is not None else err
        raise EBPOConfigError(
            f"verl's validate_config refused the config at world size {world_size(config)} (trainer.nnodes="
            f"{config.trainer.nnodes} x trainer.n_gpus_per_node={config.trainer.n_gpus_per_node}): {_one_line(reason)}"
        ) from err


def _one_line(err: BaseException) -> str:
    text = "; ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return text or type(err).__name__


def count_rows(path: str) -> int:
    """Rows of a training file as verl's ``RLHFDataset`` reads it (.parquet from its metadata; .json/.jsonl)."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            return pq.read_metadata(path).num_rows
        except Exception as err:  # pyarrow raises ArrowInvalid / OSError for a truncated or foreign file
            raise EBPOConfigError(
                f"data.train_files: {path} is not a readable parquet file ({_one_line(err)})"
            ) from err
    if path.endswith((".json", ".jsonl")):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if path.endswith(".json") and text.lstrip().startswith("["):
            try:
                return len(json.loads(text))
            except json.JSONDecodeError as err:
                raise EBPOConfigError(f"data.train_files: {path} is not valid JSON ({err})") from err
        return sum(1 for line in text.splitlines() if line.strip())
    raise EBPOConfigError(f"data.train_files: {path} has an unsupported format; verl reads .parquet, .json, .jsonl")


def check_steps_per_epoch(config: Any, *, missing_ok: bool) -> str:
    """At least one training step per epoch: the rows of ``data.train_files`` (all files, capped at
    ``data.train_max_samples``, counted before verl's overlong-prompt filter) must fill one batch (verl's
    dataloader drops the last partial batch, so fewer rows train zero steps and exit 0).

    Returns a line for the log. A missing local file raises, or with ``missing_ok`` (``--cfg job`` on a machine
    without the data) returns a line saying the count was not checked; remote files (``hdfs://``) are not counted.
    """
    files = config.data.train_files
    files = [files] if isinstance(files, str) else list(files)
    batch_key = "data.gen_batch_size" if config.data.get("gen_batch_size", None) else "data.train_batch_size"
    batch = int(OmegaConf.select(config, batch_key))
    counts = []
    for name in files:
        path = os.path.expanduser(str(name))
        if "://" in path:
            return f"steps per epoch not checked: data.train_files {path} is not a local file"
        if not os.path.isfile(path):
            if missing_ok:
                return f"steps per epoch not checked: data.train_files {path} does not exist on this machine"
            raise EBPOConfigError(
                f"data.train_files: {path} does not exist (or is not a file); prepare the data "
                "(python -m data_prep.all) or fix the path"
            )
        counts.append((path, count_rows(path)))
    rows = sum(n for _, n in counts)
    cap = int(config.data.get("train_max_samples", -1) or -1)
    capped = f", capped by data.train_max_samples={cap}" if 0 < cap < rows else ""
    rows = min(rows, cap) if cap > 0 else rows
    detail = ", ".join(f"{p}: {n} rows" for p, n in counts) + capped
    if rows < batch:
        raise EBPOConfigError(
            f"one epoch would train 0 steps: data.train_files has {rows} rows ({detail}) but {batch_key}={batch} "
            f"(verl drops the last partial batch). Use a larger training file or {batch_key}<={rows}."
        )
    return f"{rows} training rows ({detail}; before verl's overlong-prompt filter) -> {rows // batch} steps per epoch"


def preflight(config: Any, *, dry_run: bool) -> list[str]:
    """Every driver-side check of a run, in order: the estimator name in verl's registry, ours, the resume's
    tracker file and saved estimator state, verl's ``validate_config``, steps per epoch, the data files' ground
    truths and curriculum labels (:mod:`ebpo_verl.preflight_data`).

    The same for a real run and for ``--cfg job`` (``dry_run``), where a training file absent from this machine
    is reported as not checked instead of refused. Returns lines for the log; raises EBPOConfigError.
    """
    from ebpo_verl.preflight_data import check_data_files, check_estimator_name

    check_estimator_name(config)
    options = check_config(config)
    warning = ignored_options_warning(options) if options is not None else None
    if warning:
        print(f"ebpo-train: warning: {warning}", file=sys.stderr)
    versions = _versions_warning()
    if versions:
        print(f"ebpo-train: warning: {versions}", file=sys.stderr)
    resume = _check_resume(config, options)
    check_verl_config(config)
    from ebpo_verl.batch_division import check_batch_division  # each rank's share of every batch (issue 28)

    check_batch_division(config)
    steps = check_steps_per_epoch(config, missing_ok=dry_run)
    check_data_files(config, missing_ok=dry_run)
    return [f"world size {world_size(config)}", steps] + ([resume] if resume else [])


def _versions_warning() -> str | None:
    """The running library versions against recipe/ebpo/VERSIONS.txt (:func:`ebpo_verl.provenance.version_warning`);
    a malformed file is an error naming its line."""
    from ebpo_verl.provenance import version_warning

    try:
        return version_warning()
    except ValueError as err:
        raise EBPOConfigError(str(err)) from err


def _check_resume(config: Any, options: EBPOOptions | None) -> str | None:
    """The checkpoint a resume will load, checked against ``algorithm.ebpo`` / ``algorithm.spo`` on the driver
    (:func:`ebpo_verl.checkpoint.check_resume`): a mismatch under ``on_resume_mismatch=error`` or an unreadable
    state file stops here, before Ray starts and weights load."""
    from ebpo_verl.checkpoint import check_resume

    try:
        return check_resume(config.trainer, options, spo_options(config) if is_spo(config) else None)
    except ValueError as err:
        raise EBPOConfigError(str(err)) from err


def _check_curriculum(data_config: Any) -> None:
    from ebpo_verl.curriculum import validate_curriculum_config

    try:
        validate_curriculum_config(data_config)
    except ValueError as err:
        raise EBPOConfigError(str(err)) from err


def check_registered(name: str = ESTIMATOR) -> None:
    """Make sure ``name`` (``ebpo`` or another estimator of ours) is in verl's registry of *this* process (the
    TaskRunner actor).

    verl's plugin loader swallows import errors, which would otherwise surface as "Unknown advantage estimator"
    after the first rollout.
    """
    from verl.trainer.ppo import core_algos

    try:
        import ebpo_verl

        ebpo_verl.register()
        core_algos.get_adv_estimator_fn(name)
    except Exception as err:
        raise EBPOConfigError(
            f"advantage estimator '{name}' is not registered in the TaskRunner process "
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
        if is_missing_label(info.get(cluster_key)):
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


def check_prompt_keys(extra_infos: Iterable[Mapping[str, Any] | None], prompt_key: str, source: str) -> None:
    """SPO's tracker key: every training row needs ``extra_info[prompt_key]`` (not null), unique over the rows.

    verl's uid is drawn afresh every step, so SPO refuses to fall back to it; a key shared by two rows would merge
    two prompts' trackers (several training files each number ``index`` from 0).
    """
    existing: set[str] = set()
    missing: list[int] = []
    first_row: dict[str, int] = {}
    duplicates: list[tuple[str, int, int]] = []
    rows = 0
    for row, info in enumerate(extra_infos):
        rows += 1
        info = info or {}
        existing.update(str(k) for k in info)
        value = info.get(prompt_key)
        if is_missing_label(value):
            missing.append(row)
            continue
        key = str(value)
        if key in first_row:
            duplicates.append((key, first_row[key], row))
        else:
            first_row[key] = row
    if missing and prompt_key not in existing:
        raise EBPOConfigError(
            f"algorithm.spo.prompt_key={prompt_key!r} is not a key of extra_info in the training data ({source}); "
            f"extra_info keys present: {sorted(existing) or 'none'}. SPO tracks each prompt across steps by this "
            "key (verl's uid changes every step): pick a field unique per prompt, or add one in data_prep."
        )
    if missing:
        raise EBPOConfigError(
            f"extra_info[{prompt_key!r}] (algorithm.spo.prompt_key) is missing or null in {len(missing)} of {rows} "
            f"training rows ({source}); first rows: {missing[:10]}. Every prompt needs a key: fix the data."
        )
    if duplicates:
        key, a, b = duplicates[0]
        raise EBPOConfigError(
            f"extra_info[{prompt_key!r}] (algorithm.spo.prompt_key) is not unique in the training data ({source}): "
            f"{len(duplicates)} row(s) repeat an earlier row's key (first: {key!r} at rows {a} and {b}), which would "
            "merge their SPO trackers. Several training files each number `index` from 0: set "
            "algorithm.spo.prompt_key to a field unique across them."
        )
