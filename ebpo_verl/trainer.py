"""EBPO inside verl 0.9.1's v1 trainer: cluster labels, EB state in checkpoints, ``ebpo/*`` metrics, metrics log.

verl's ``compute_advantage`` calls an estimator with rewards, masks and uids only, and its checkpoints know nothing
of the estimator's running statistics. :class:`EBPOTrainerMixin` adds, on top of whichever v1 trainer
``trainer.v1.trainer_mode`` selects (sync / colocate_async / separate_async):

- ``_compute_advantage``: the ``ebpo`` step with each row's ``extra_info[cluster_key]`` fetched from
  TransferQueue and passed as ``labels`` (padding rows: None), and the estimator diagnostics added to the step's
  metrics (so every tracker backend logs ``ebpo/*``). ``spo`` likewise, with each row's stable
  ``extra_info[algorithm.spo.prompt_key]`` as its tracker key (``spo/*`` metrics). Other estimators run verl's
  code unchanged (``bnpo`` adds its ``bnpo/*`` diagnostics to the metrics), except verl's Optimal Token Baseline.
- Optimal Token Baseline (``optimal_token_baseline`` / ``tir_optimal_token_baseline`` with
  ``actor.calculate_sum_pi_squared=True``): verl 0.9.1's v1 trainer neither asks the actor for the per-token sum
  of squared probabilities nor passes it to the estimator (only its legacy trainer does), so OTB would stop at
  verl's ``sum_pi_squared`` assertion. ``_compute_old_log_prob`` asks the actor for it (the engine's
  ``calculate_sum_pi_squared`` flag) and stores its response part in TransferQueue as ``sum_pi_squared_response``;
  ``_compute_advantage`` fetches it and runs verl's ``compute_advantage``, which passes it, ``old_log_probs`` and
  any rollout IS weights to the registered estimator; ``otb/sum_pi_squared_mean`` (token mean) is logged.
- ``_save_checkpoint`` / ``_load_checkpoint``: ``global_step_N/ebpo_state.json`` (:mod:`ebpo_verl.checkpoint`),
  restored in ``init()``, i.e. before the first advantage computation; ``spo_state.json`` likewise for ``spo``.
  Every checkpoint also holds the step's training metrics (``ebpo_step_metrics.json``): verl validates between
  its tracker file and the step's log call, so a run killed there logs them on resume if the metrics log lacks
  them.
- ``_init_dataloader``: checks that every training row carries its cluster label (``spo``: a unique prompt key),
  before any worker starts.
- ``logger``: verl's ``Tracking`` gets one more backend, the append-only :class:`~ebpo_verl.metrics_log.MetricsLog`
  at ``trainer.metrics_log_path``.

:class:`EBPOTaskRunner` is verl's ``TaskRunnerV1`` running these trainers after the pre-flight checks and
:func:`~ebpo_verl.node_check.check_nodes` (every Ray node sees the same data and output paths).
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from pprint import pprint
from typing import Any

import numpy as np
import ray
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1 import PPOTrainer, get_trainer_cls
from verl.utils.logging_utils import configure_verl_logging
from verl.workers.utils.padding import response_from_nested, response_to_nested

import ebpo_verl
from ebpo_verl.baselines import BNPO_DIAGNOSTICS, SPO_STATE
from ebpo_verl.checkpoint import (
    load_ebpo_state,
    load_spo_state,
    load_step_metrics,
    save_ebpo_state,
    save_spo_state,
    save_step_metrics,
    unlogged_step_metrics,
)
from ebpo_verl.estimator import is_missing_label
from ebpo_verl.metrics_log import MetricsLog, read_metrics_log
from ebpo_verl.node_check import check_nodes
from ebpo_verl.provenance import run_provenance
from ebpo_verl.validation import (
    ESTIMATOR,
    SPO,
    EBPOConfigError,
    check_cluster_labels,
    check_config,
    check_prompt_keys,
    check_registered,
    ebpo_options,
    is_ebpo,
    is_spo,
    spo_options,
)
from ebpo_verl.verl_adapter import ESTIMATORS, ignored_options_reported
from ebpo_verl.watchdog import StepWatchdogMixin

STEP_TIME_KEYS = frozenset({"timing_s/step", "perf/time_per_step", "perf/throughput"})
"""Metrics of the step's total time, unknown while its checkpoint is written (not in the saved metrics)."""

ADVANTAGE_FIELDS = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob"]
OTB_ESTIMATORS = (
    core_algos.AdvantageEstimator.OPTIMAL_TOKEN_BASELINE.value,
    core_algos.AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE.value,
)
SUM_PI_SQUARED = "sum_pi_squared_response"
"""TransferQueue field: the actor's per-token sum of squared probabilities over the response tokens (OTB)."""
"""What verl's v1 advantage step reads from TransferQueue (minus ``values``, which only GAE needs)."""


def cluster_labels(
    extra_infos: Sequence[Mapping[str, Any] | None],
    uids: Sequence[Any],
    padding: Sequence[bool],
    cluster_key: str,
    option: str = "algorithm.ebpo.cluster_key",
) -> np.ndarray:
    """Per-row ``extra_info[cluster_key]``, aligned with ``uids``; None on padding rows (also SPO's prompt keys,
    ``option`` naming the setting in the error).

    Padding rows (flagged, or uid starting with ``pad``) copy a real row's fields in verl, so their label is
    ignored. A real row without a label raises, naming its uid and the keys its ``extra_info`` has.
    """
    labels = np.empty(len(uids), dtype=object)
    for i, (info, uid, pad) in enumerate(zip(extra_infos, uids, padding, strict=True)):
        if pad or str(uid).startswith("pad"):
            continue
        label = (info or {}).get(cluster_key)
        if is_missing_label(label):
            raise EBPOConfigError(
                f"rollout row of uid {uid} has no extra_info[{cluster_key!r}] ({option}); its "
                f"extra_info keys: {sorted(info or {})}"
            )
        labels[i] = label
    return labels


def compute_ebpo_advantage(data: DataProto, algorithm_config: Any, labels: np.ndarray | None) -> dict[str, float]:
    """Run the registered ``ebpo`` estimator on ``data`` (in place: ``advantages``, ``returns``).

    ``data`` needs ``token_level_rewards``, ``response_mask`` and ``non_tensor_batch["uid"]``. Returns the
    estimator diagnostics of this call (``ebpo/*``).
    """
    estimator = core_algos.get_adv_estimator_fn(ESTIMATOR)
    advantages, returns = estimator(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        index=data.non_tensor_batch["uid"],
        config=algorithm_config,
        labels=labels,
    )
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return dict(ebpo_verl.get_state().diagnostics)


def compute_spo_advantage(data: DataProto, algorithm_config: Any, prompt_keys: np.ndarray) -> dict[str, float]:
    """Run the registered ``spo`` estimator on ``data`` (in place), its tracker keyed by ``prompt_keys``.

    As :func:`compute_ebpo_advantage`; returns the ``spo/*`` diagnostics of this call.
    """
    advantages, returns = core_algos.get_adv_estimator_fn(SPO)(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        index=data.non_tensor_batch["uid"],
        config=algorithm_config,
        prompt_keys=prompt_keys,
    )
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return dict(SPO_STATE.diagnostics)


def _dataset_extra_infos(dataset: Any) -> Iterable[Mapping[str, Any] | None]:
    """The ``extra_info`` column of verl's ``RLHFDataset`` (read from its table: indexing the dataset would
    tokenize every row and advance a curriculum dataset's position)."""
    frame = getattr(dataset, "dataframe", None)
    if frame is None:
        raise EBPOConfigError(
            "algorithm.ebpo.cluster_key / algorithm.spo.prompt_key need the training dataset's table; "
            f"{type(dataset).__name__} has no `dataframe` (use verl's RLHFDataset or a subclass such as "
            "ebpo_verl.curriculum.CurriculumDataset)"
        )
    if "extra_info" not in frame.column_names:
        return [None] * len(frame)
    return frame["extra_info"]


def checkpoint_folder(config: Any, global_step: int) -> str:
    """The ``global_step_N`` folder verl resumed from (``resume_mode`` auto or resume_path), as an absolute path."""
    trainer = config.trainer
    if trainer.resume_mode == "resume_path":
        return os.path.abspath(str(trainer.resume_from_path))
    return os.path.join(os.path.abspath(str(trainer.default_local_dir)), f"global_step_{global_step}")


class EBPOTrainerMixin:
    """EBPO additions to a verl v1 ``PPOTrainer`` subclass (put first in the bases)."""

    _resumed_step = 0
    _tracking = None
    _step_output = None  # (batch, metrics) of the step in progress, for the metrics saved with its checkpoint
    otb = False  # verl's Optimal Token Baseline: the actor's sum_pi_squared is fetched and passed to it

    def __init__(self, config: DictConfig):
        super().__init__(config)
        self.ebpo_options = ebpo_options(config) if is_ebpo(config) else None
        self.spo_options = spo_options(config) if is_spo(config) else None
        self.otb = str(config.algorithm.adv_estimator) in OTB_ESTIMATORS

    # ----------------------------------------------------- old log-probs (OTB)
    def _compute_old_log_prob(self, batch, metrics: dict):
        """verl's old-log-prob step; for OTB the actor also returns the per-token sum of squared probabilities,
        kept (response part) as :data:`SUM_PI_SQUARED` for the advantage step."""
        if not self.otb:
            return super()._compute_old_log_prob(batch, metrics)
        import transfer_queue as tq

        corr = self.config.algorithm.get("rollout_correction", None)
        if corr is not None and corr.get("bypass_mode", False):
            raise EBPOConfigError(
                f"algorithm.adv_estimator={self.config.algorithm.adv_estimator} needs the actor's sum of squared "
                "probabilities, which algorithm.rollout_correction.bypass_mode=true never computes: set it false"
            )
        batch.extra_info["calculate_sum_pi_squared"] = True
        batch = super()._compute_old_log_prob(batch, metrics)
        batch.extra_info.pop("calculate_sum_pi_squared", None)
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["sum_pi_squared", "response_mask"]
        )
        spp = response_from_nested(data["sum_pi_squared"], data["response_mask"])
        return tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=TensorDict({SUM_PI_SQUARED: spp}, batch_size=len(batch)),
        )

    # ---------------------------------------------------------------- data
    def _init_dataloader(self) -> None:
        super()._init_dataloader()
        key = self.ebpo_options.cluster_key if self.ebpo_options else None
        if key:
            source = f"data.train_files={self.config.data.train_files}"
            check_cluster_labels(_dataset_extra_infos(self.train_dataset), key, source=source)
        if self.spo_options is not None:
            source = f"data.train_files={self.config.data.train_files}"
            check_prompt_keys(_dataset_extra_infos(self.train_dataset), self.spo_options.prompt_key, source=source)

    # ----------------------------------------------------------- advantage
    def _compute_advantage(self, batch, metrics: dict):
        if self.ebpo_options is None and self.spo_options is None and not self.otb:
            BNPO_DIAGNOSTICS.clear()
            out = super()._compute_advantage(batch, metrics)
            if str(self.config.algorithm.adv_estimator) == "bnpo":
                metrics.update(BNPO_DIAGNOSTICS)  # bnpo/max_abs_adv: the formula's 1/pdf can reach ~1e5-1e6
            return out
        import transfer_queue as tq

        algo = self.config.algorithm
        options = self.spo_options or self.ebpo_options
        key = None if options is None else options.prompt_key if self.spo_options else options.cluster_key
        fields = ADVANTAGE_FIELDS + (["extra_info"] if key else []) + ([SUM_PI_SQUARED] if self.otb else [])
        fetched = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        response_mask = fetched["response_mask"]
        uids = np.array(fetched.pop("uid").tolist(), dtype=object)
        labels = None
        if key:
            padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
            option = "algorithm.spo.prompt_key" if self.spo_options else "algorithm.ebpo.cluster_key"
            labels = cluster_labels(fetched.pop("extra_info").tolist(), uids, padding, key, option)
        data = DataProto(batch=fetched.to_padded_tensor(), non_tensor_batch={"uid": uids})
        data.batch["token_level_scores"] = data.batch["rm_scores"]

        if algo.use_kl_in_reward:
            data, kl_metrics = apply_kl_penalty(data, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=algo.kl_penalty)
            metrics.update(kl_metrics)
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]

        # decoupled rollout correction (IS weights / rejection sampling), as verl does before its estimators
        corr = algo.get("rollout_correction", None)
        correct = corr is not None and not corr.get("bypass_mode", False) and "rollout_log_probs" in data.batch
        if correct:
            data, corr_metrics = compute_rollout_correction_and_add_to_batch(data, corr)
            metrics.update(corr_metrics)

        if self.otb:  # verl's compute_advantage passes sum_pi_squared, old_log_probs and the IS weights to OTB
            data.batch["sum_pi_squared"] = data.batch.pop(SUM_PI_SQUARED)
            mask = data.batch["response_mask"].bool()
            metrics["otb/sum_pi_squared_mean"] = float(data.batch["sum_pi_squared"][mask].mean())
            data = compute_advantage(data, adv_estimator=algo.adv_estimator, config=algo)
        elif self.spo_options is not None:
            metrics.update(compute_spo_advantage(data, algo, labels))
        else:
            metrics.update(compute_ebpo_advantage(data, algo, labels))

        out = ["advantages", "returns"]
        if algo.use_kl_in_reward:
            out.append("token_level_rewards")
        if correct:
            out += ["response_mask"] + (["rollout_is_weights"] if "rollout_is_weights" in data.batch else [])
        nested = {name: response_to_nested(data.batch[name], response_mask) for name in out}
        return tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(nested, batch_size=len(batch))
        )

    # ---------------------------------------------------------- checkpoint
    def step(self, metrics: dict, timing_raw: dict):
        batch = super().step(metrics, timing_raw)
        self._step_output = (batch, metrics)
        return batch

    def _training_metrics(self) -> dict[str, Any]:
        """The step's training metrics as verl's log call will have them (``_compute_metrics`` on a copy),
        minus what is not known at the checkpoint: the step's total time (``STEP_TIME_KEYS``), weight-sync stats
        and validation."""
        batch, metrics = self._step_output
        out = dict(metrics)
        accumulator = self._rollout_moe_lb_metrics_accumulator
        self._rollout_moe_lb_metrics_accumulator = copy.deepcopy(accumulator)  # verl's own call accumulates
        try:
            epoch = (self.global_steps - 1) // self.steps_per_epoch
            timing = {**self.timing_raw, "step": float("nan")}  # the step timer is still running
            self._compute_metrics(batch, out, timing, global_steps=self.global_steps, epoch=epoch)
        finally:
            self._rollout_moe_lb_metrics_accumulator = accumulator
        return {k: v for k, v in out.items() if k not in STEP_TIME_KEYS}

    def _save_checkpoint(self) -> None:
        # written before verl's latest_checkpointed_iteration.txt: a resumable checkpoint always has them
        if self._step_output is not None:
            folder = os.path.join(str(self.config.trainer.default_local_dir), f"global_step_{self.global_steps}")
            save_step_metrics(folder, self._training_metrics(), self.global_steps)
        if self.ebpo_options is not None:
            folder = os.path.join(str(self.config.trainer.default_local_dir), f"global_step_{self.global_steps}")
            save_ebpo_state(folder, ebpo_verl.get_state(), self.ebpo_options, self.global_steps)
        if self.spo_options is not None:
            folder = os.path.join(str(self.config.trainer.default_local_dir), f"global_step_{self.global_steps}")
            save_spo_state(folder, SPO_STATE, self.spo_options, self.global_steps)
        super()._save_checkpoint()

    def _load_checkpoint(self) -> None:
        ebpo_verl.get_state().reset()
        SPO_STATE.reset()
        super()._load_checkpoint()
        self._resumed_step = int(self.global_steps)
        if self.ebpo_options is not None and self.global_steps > 0:
            folder = checkpoint_folder(self.config, self.global_steps)
            load_ebpo_state(folder, ebpo_verl.get_state(), self.ebpo_options, self.global_steps)
        if self.spo_options is not None and self.global_steps > 0:
            load_spo_state(
                checkpoint_folder(self.config, self.global_steps), SPO_STATE, self.spo_options, self.global_steps
            )

    # ------------------------------------------------------------- metrics
    @property
    def logger(self):
        """verl's ``Tracking`` (created in ``fit``), with the resume-safe metrics log as an extra backend."""
        return self._tracking

    @logger.setter
    def logger(self, tracking) -> None:
        path = self.config.trainer.get("metrics_log_path", None)
        if tracking is not None and path:
            record = run_provenance(self.config)  # provenance: the sidecar <log>.provenance.json
            tracking.logger["metrics_log"] = MetricsLog(path, resumed_step=self._resumed_step, provenance=record)
            self._log_unlogged_step(tracking, path)
        self._tracking = tracking

    def _log_unlogged_step(self, tracking, path: str) -> None:
        """A run killed after its checkpoint but before verl logged that step (verl validates in between): the
        training metrics saved with the checkpoint go to every backend now, unless the metrics log has them.
        Only for a checkpoint of this run's own folder (a ``resume_path`` elsewhere starts another timeline)."""
        step = self._resumed_step
        folder = checkpoint_folder(self.config, step)
        own = os.path.dirname(folder) == os.path.abspath(str(self.config.trainer.default_local_dir))
        if step <= 0 or not own:
            return
        try:
            saved = load_step_metrics(folder, step) or {}
        except ValueError as err:  # the metrics are a record, not training state: never stop the run for them
            print(f"ebpo-train: warning: {err}", flush=True)
            saved = {}
        logged = read_metrics_log(path).get(step, {}) if os.path.isfile(path) else {}
        missing = unlogged_step_metrics(saved, logged)
        if missing:
            print(
                f"ebpo-train: step {step}'s training metrics were not logged before the last run stopped; logging "
                f"{len(missing)} of them from {folder}",
                flush=True,
            )
            tracking.log(data=missing, step=step)


@functools.cache
def ebpo_trainer_cls(trainer_mode: str) -> type[PPOTrainer]:
    """The verl v1 trainer registered for ``trainer_mode``, with :class:`EBPOTrainerMixin` in front."""
    base = get_trainer_cls(trainer_mode)
    return type(f"EBPO{base.__name__}", (StepWatchdogMixin, EBPOTrainerMixin, base), {"__module__": __name__})


@ray.remote
class EBPOTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's v1 TaskRunner (the Ray actor that drives training and calls the estimator) with EBPO's trainer."""

    def preflight(self, config: DictConfig) -> None:
        """Checks that must run in this process: config sanity and the registration of our estimator."""
        check_config(config)
        if str(config.algorithm.adv_estimator) in ESTIMATORS:
            check_registered(str(config.algorithm.adv_estimator))
        ignored_options_reported()  # the driver's pre-flight named the ignored options already

    def run(self, config: DictConfig) -> None:
        configure_verl_logging()
        self.preflight(config)
        check_nodes(config)  # every Ray node sees the data files and output folders at the same paths
        import transfer_queue as tq

        trainer_cls = ebpo_trainer_cls(config.trainer.v1.trainer_mode)
        config.transfer_queue.enable = True
        pprint(OmegaConf.to_container(config, resolve=True))
        OmegaConf.resolve(config)
        self.config = config
        tq.init(config.transfer_queue)
        succeeded = False
        try:
            self.trainer = trainer_cls(config=config)
            self.trainer.init()
            self.init_agent_loop_manager()
            self.trainer.fit(self.agent_loop_manager)
            succeeded = True
        finally:
            try:
                tracking = getattr(self.trainer, "logger", None)
                if tracking is not None:
                    tracking.finish(exit_code=0 if succeeded else 1)
            finally:
                tq.close()
