"""EBPO inside verl 0.9.1's v1 trainer: per-row keys for the estimator, its state in checkpoints, ``ebpo/*``
metrics, the metrics log, and verl's Optimal Token Baseline made runnable.

:class:`EBPOTrainerMixin` overrides, through ``super()``, ``_compute_advantage`` (the trainer owns the estimator and
runs :func:`copied_compute_advantage` with it), ``_save_checkpoint`` / ``_load_checkpoint`` (its state,
:mod:`~ebpo_verl.trainer.checkpoint.state`, and the step metrics), ``_init_dataloader`` (the per-row field checked)
and ``logger`` (:class:`~ebpo_verl.ops.metrics_log.MetricsLog`; :func:`purge_tensorboard` on a resume).
:func:`copied_compute_advantage` is the one copy of a verl method. :class:`EBPOTaskRunner` is verl's
``TaskRunnerV1.run`` with these trainers, after the options, registration and node checks.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import ray
import torch
from omegaconf import DictConfig
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo.ray_trainer import apply_kl_penalty
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1 import PPOTrainer, get_trainer_cls
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
from verl.workers.utils.padding import response_from_nested, response_to_nested

from ebpo_verl.algos import registry
from ebpo_verl.algos.estimator import Estimator
from ebpo_verl.compat.contact import swapped
from ebpo_verl.ops.errors import EBPOConfigError, shorten
from ebpo_verl.ops.metrics_log import MetricsLog, read_metrics_log
from ebpo_verl.ops.node_check import check_nodes
from ebpo_verl.ops.provenance import run_provenance
from ebpo_verl.options.parsing import is_missing
from ebpo_verl.trainer.adapter import PAD_PREFIX, advantage_step
from ebpo_verl.trainer.checkpoint.resume import loaded_folder, step_folder
from ebpo_verl.trainer.checkpoint.state import load_state, save_state
from ebpo_verl.trainer.checkpoint.step_metrics import load_step_metrics, save_step_metrics, unlogged_step_metrics
from ebpo_verl.trainer.checkpoint.trusted_load import TrustedLoadMixin
from ebpo_verl.trainer.preflight.data import check_row_keys
from ebpo_verl.trainer.preflight.registry import check_registered
from ebpo_verl.trainer.run_options import RunOptions
from ebpo_verl.trainer.watchdog import StepWatchdogMixin

STEP_TIME_KEYS = frozenset({"timing_s/step", "perf/time_per_step", "perf/throughput"})
"""Metrics of the step's total time, unknown while its checkpoint is written (not in the saved metrics)."""

SUM_PI_SQUARED = "sum_pi_squared_response"
"""TransferQueue field: the actor's per-token sum of squared probabilities over the response tokens (OTB)."""
ADVANTAGE_FIELDS = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob", "values"]
"""What verl's v1 advantage step reads from TransferQueue."""


def extra_info_values(
    extra_infos: Sequence[Mapping[str, Any] | None],
    uids: Sequence[Any],
    padding: Sequence[bool],
    key: str,
    option: str,
) -> np.ndarray:
    """Each row's ``extra_info[key]``, an object array (``option`` names the setting in the errors).

    Padding rows (flagged, or uid starting with ``pad``) copy a real row's fields in verl: they get None. A real row
    without the field raises, naming its uid and the keys its ``extra_info`` has; so do two rows of one uid whose
    values read differently (the estimators compare them as strings).
    """
    out = np.full(len(uids), None, dtype=object)
    first: dict[str, Any] = {}
    for row, (info, uid, pad) in enumerate(zip(extra_infos, uids, padding, strict=True)):
        uid = str(uid)
        if pad or uid.startswith(PAD_PREFIX):
            continue
        value = (info or {}).get(key)
        if is_missing(value):
            raise EBPOConfigError(
                f"rollout row of uid {uid} has no extra_info[{key!r}] ({option}); its extra_info keys: "
                f"{sorted(info or {})}"
            )
        if str(first.setdefault(uid, value)) != str(value):
            raise EBPOConfigError(
                f"uid {uid} carries more than one extra_info[{key!r}] ({option}): {first[uid]!r}, {value!r}"
            )
        out[row] = value
    return out


_TRAJECTORY_KEY = re.compile(r".+_([0-9]{1,18})_[0-9]{1,18}", re.DOTALL)
"""A non-empty uid, then the session id and the index in ASCII digits (``"²".isdigit()`` is true, ``int("²")``
fails)."""


def sample_indices(trajectory_keys: Sequence[str]) -> np.ndarray:
    """Each row's rollout sample index from verl's v1 trajectory key ``{uid}_{session_id}_{index}`` (session_id in
    [0, n): the sample's index in its group; verl ``trainer/ppo/v1/replay_buffer.py``); object array of ints."""
    out = np.empty(len(trajectory_keys), dtype=object)
    for row, key in enumerate(trajectory_keys):
        match = _TRAJECTORY_KEY.fullmatch(str(key))
        if match is None:
            raise ValueError(f"krpo: trajectory key {shorten(key)} is not verl's {{uid}}_{{session_id}}_{{index}}")
        out[row] = int(match.group(1))
    return out


def step_row_values(estimator: Estimator, data: DataProto, batch) -> np.ndarray | None:
    """What ``estimator`` reads per row of this step (``estimator.spec.row_source``), read once into the rows:
    each row's rollout sample index from ``batch``'s trajectory keys (:func:`sample_indices`) or its ``extra_info``
    field (fetched with the step's fields; ``batch``'s tags flag padding); None when it reads nothing."""
    source = estimator.spec.row_source(estimator.options)
    if source is None:
        return None
    if source.sample_index:
        return sample_indices(batch.keys)
    padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
    infos, uids = data.non_tensor_batch["extra_info"], data.non_tensor_batch["uid"]
    return extra_info_values(infos, uids, padding, source.field, estimator.spec.row_option)


def copied_compute_advantage(
    trainer: PPOTrainer, batch, metrics: dict, extra: Mapping[str, str], estimator: Estimator | None = None
):
    """verl 0.9.1's ``PPOTrainer._compute_advantage`` (the one copy of a verl method) on ``trainer`` with the
    TransferQueue fields ``extra`` (name -> name in the batch; a non-tensor field, such as ``extra_info``, goes to
    ``non_tensor_batch``) fetched in the same call; with ``estimator``, the one advantage step
    (:func:`~ebpo_verl.trainer.adapter.advantage_step`) runs it where verl's ``compute_advantage`` would call the
    registered estimator function."""
    import transfer_queue as tq

    algo = trainer.config.algorithm
    fetched = tq.kv_batch_get(
        keys=batch.keys, partition_id=batch.partition_id, select_fields=ADVANTAGE_FIELDS + list(extra)
    )
    response_mask = fetched["response_mask"]
    data = DataProto(batch=fetched.to_padded_tensor())
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    for name, renamed in extra.items():
        value = data.batch.pop(name)
        if isinstance(value, torch.Tensor):
            data.batch[renamed] = value
        else:  # a NonTensorStack: one object per row
            data.non_tensor_batch[renamed] = np.array(value.tolist(), dtype=object)

    if algo.use_kl_in_reward:
        data, kl_metrics = apply_kl_penalty(data, kl_ctrl=trainer.kl_ctrl_in_reward, kl_penalty=algo.kl_penalty)
        metrics.update(kl_metrics)
    else:
        data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    corr = algo.get("rollout_correction", None)
    correct = corr is not None and "rollout_log_probs" in data.batch and not corr.get("bypass_mode", False)
    if correct:
        data, corr_metrics = compute_rollout_correction_and_add_to_batch(data, corr)
        metrics.update(corr_metrics)
    if "sum_pi_squared" in data.batch:
        mask = data.batch["response_mask"].bool()
        metrics["otb/sum_pi_squared_mean"] = float(data.batch["sum_pi_squared"][mask].mean())
    if estimator is not None:
        rows = step_row_values(estimator, data, batch)
        data.batch["advantages"], data.batch["returns"], diagnostics = advantage_step(data, estimator, rows)
        metrics.update(diagnostics)  # bnpo/max_abs_adv: 1/pdf can reach ~1e5-1e6
    else:
        data = compute_advantage_for_multi_trajectories(
            data,
            batch_keys=batch.keys,
            adv_estimator=algo.adv_estimator,
            gamma=algo.gamma,
            lam=algo.lam,
            num_repeat=trainer.config.actor_rollout_ref.rollout.n,
            norm_adv_by_std_in_grpo=algo.get("norm_adv_by_std_in_grpo", True),
            config=algo,
        )
    out = ["advantages", "returns"] + (["token_level_rewards"] if algo.use_kl_in_reward else [])
    if correct:
        out += ["response_mask"] + (["rollout_is_weights"] if "rollout_is_weights" in data.batch else [])
    nested = {name: response_to_nested(data.batch[name], response_mask) for name in out}
    return tq.kv_batch_put(
        keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(nested, batch_size=len(batch))
    )


class OTBSumPiSquaredMixin:
    """verl's Optimal Token Baseline (``optimal_token_baseline`` / ``tir_optimal_token_baseline``) on the v1 trainer.

    verl 0.9.1's v1 trainer never computes or passes the per-token sum of squared probabilities (only its legacy
    trainer does), so OTB would fail ``compute_advantage``'s ``sum_pi_squared`` assertion. For OTB runs only:

    - ``_compute_old_log_prob`` sets the engine's ``calculate_sum_pi_squared`` flag and stores the response part of
      the actor's output in TransferQueue as :data:`SUM_PI_SQUARED`;
    - ``_compute_advantage`` is :func:`copied_compute_advantage`, verl's v1 step fetching that one field more,
      passed to OTB with ``old_log_probs`` and any IS weights; logs ``otb/sum_pi_squared_mean``.

    The bypass mode (no old-log-prob pass) and fused kernels are refused by the pre-flight.
    """

    otb = False

    def __init__(self, config: DictConfig):
        super().__init__(config)
        verl_spec = registry.by_verl_name(str(config.algorithm.adv_estimator))
        self.otb = verl_spec is not None and verl_spec.sum_pi_squared

    def _compute_old_log_prob(self, batch, metrics: dict):
        if not self.otb:
            return super()._compute_old_log_prob(batch, metrics)
        import transfer_queue as tq

        batch.extra_info["calculate_sum_pi_squared"] = True
        batch = super()._compute_old_log_prob(batch, metrics)
        batch.extra_info.pop("calculate_sum_pi_squared", None)
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["sum_pi_squared", "response_mask"]
        )
        # the response tokens' part: position t holds the distribution that produced token t + 1, so response token
        # j of a sequence with prompt length P reads position P + j - 1, the slice verl takes of the log-probs
        spp = response_from_nested(data["sum_pi_squared"], data["response_mask"])
        return tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=TensorDict({SUM_PI_SQUARED: spp}, batch_size=len(batch)),
        )

    def _compute_advantage(self, batch, metrics: dict):
        if not self.otb:
            return super()._compute_advantage(batch, metrics)
        return copied_compute_advantage(self, batch, metrics, {SUM_PI_SQUARED: "sum_pi_squared"})


class EBPOTrainerMixin:
    """EBPO additions to a verl v1 ``PPOTrainer`` subclass (put first in the bases, before
    :class:`OTBSumPiSquaredMixin`); ``options`` are the run's, parsed
    by the caller (the TaskRunner) or, when not given, here. ``estimator`` is the run's estimator object (None:
    verl's own step runs the estimator), its state saved with every checkpoint."""

    _resumed_step = 0
    _tracking = None
    _step_output = None  # (batch, metrics) of the step in progress, for the metrics saved with its checkpoint

    def __init__(self, config: DictConfig, options: RunOptions | None = None):
        super().__init__(config)
        self.options = options if options is not None else RunOptions.from_config(config)
        spec = self.options.spec
        self.estimator = None if spec is None else registry.new_estimator(spec, self.options.estimator)

    # ---------------------------------------------------------------- data
    def _init_dataloader(self) -> None:
        super()._init_dataloader()
        if not self.options.row_key:
            return
        # the extra_info column of the dataset's table: indexing the dataset would tokenize every row and advance a
        # curriculum dataset's position
        frame = getattr(self.train_dataset, "dataframe", None)
        if frame is None:
            raise EBPOConfigError(
                f"{self.options.spec.row_option}={self.options.row_key} needs the training dataset's table; "
                f"{type(self.train_dataset).__name__} has no `dataframe` (use verl's RLHFDataset or a subclass such "
                "as ebpo_verl.trainer.curriculum.CurriculumDataset)"
            )
        infos = frame["extra_info"] if "extra_info" in frame.column_names else [None] * len(frame)
        check_row_keys(infos, self.options, source=f"data.train_files={self.config.data.train_files}")

    # ----------------------------------------------------------- advantage
    def _compute_advantage(self, batch, metrics: dict):
        if self.estimator is None:
            return super()._compute_advantage(batch, metrics)
        extra = {"extra_info": "extra_info"} if self.options.row_key else {}  # fetched with the step's fields
        return copied_compute_advantage(self, batch, metrics, extra, self.estimator)

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
        folder = step_folder(self.config.trainer, self.global_steps)
        if self._step_output is not None:
            save_step_metrics(folder, self._training_metrics(), self.global_steps)
        if (entry := self.options.stateful) is not None:
            save_state(entry, folder, self.estimator.state, self.options.estimator, self.global_steps)
        super()._save_checkpoint()

    def _load_checkpoint(self) -> None:
        if self.estimator is not None:
            self.estimator.reset()
        super()._load_checkpoint()
        self._resumed_step = int(self.global_steps)
        if (entry := self.options.stateful) is not None and self.global_steps > 0:
            folder = loaded_folder(self.config.trainer, self.global_steps)
            load_state(entry, folder, self.estimator.state, self.options.estimator, self.global_steps)

    # ------------------------------------------------------------- metrics
    @property
    def logger(self):
        """verl's ``Tracking`` (created in ``fit``), with the resume-safe metrics log as an extra backend."""
        return self._tracking

    @logger.setter
    def logger(self, tracking) -> None:
        path = self.config.trainer.get("metrics_log_path", None)
        if tracking is not None and self._resumed_step > 0:
            purge_tensorboard(tracking, self._resumed_step + 1)
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
        folder = loaded_folder(self.config.trainer, step)
        if step <= 0 or folder != step_folder(self.config.trainer, step):
            return
        try:
            saved = load_step_metrics(folder, step) or {}
        except ValueError as err:  # the metrics are a record, not training state: never stop the run for them
            print(f"ebpo-train: warning: {err}", flush=True)
            saved = {}
        logged = read_metrics_log(path).get(step, {}) if os.path.isfile(path) else {}
        if missing := unlogged_step_metrics(saved, logged):
            print(
                f"ebpo-train: step {step}'s training metrics were not logged before the last run stopped; logging "
                f"{len(missing)} of them from {folder}",
                flush=True,
            )
            purge_tensorboard(tracking, step)
            tracking.log(data=missing, step=step)


def purge_tensorboard(tracking, first_step: int) -> None:
    """A resumed run's TensorBoard events replace those of steps >= ``first_step`` that an earlier attempt wrote
    (retrained steps): TensorBoard's reader drops them at a ``SessionLog.START`` event of that step, the event
    ``SummaryWriter(purge_step=...)`` writes (verl 0.9.1's adapter opens its writer without one)."""
    adapter = tracking.logger.get("tensorboard")
    if adapter is None:
        return
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    start = Event(step=first_step, wall_time=time.time(), session_log=SessionLog(status=SessionLog.START))
    adapter.writer._get_file_writer().add_event(start)


@functools.cache
def ebpo_trainer_cls(trainer_mode: str) -> type[PPOTrainer]:
    """The verl v1 trainer registered for ``trainer_mode``, with :class:`EBPOTrainerMixin` in front."""
    base = get_trainer_cls(trainer_mode)
    # the watchdog times all of a phase; the resume loads data only (trainer.trust_checkpoint)
    bases = (StepWatchdogMixin, TrustedLoadMixin, EBPOTrainerMixin, OTBSumPiSquaredMixin, base)
    return type(f"EBPO{base.__name__}", bases, {"__module__": __name__})


@ray.remote
class EBPOTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's v1 TaskRunner (the Ray actor that drives training and calls the estimator) with EBPO's trainer."""

    def preflight(self, config: DictConfig) -> RunOptions:
        """What must run in this process: the run's options (parsed once here) and our estimator's registration."""
        options = RunOptions.from_config(config)
        if options.spec is not None:
            check_registered(options.adv_estimator)
        return options

    def run(self, config: DictConfig) -> None:
        """verl's ``TaskRunnerV1.run``, whose trainer (looked up in verl's trainer registry by
        ``trainer.v1.trainer_mode``) is, in this process and for this call, :func:`ebpo_trainer_cls`'s with the
        run's options."""
        options = self.preflight(config)
        check_nodes(config)  # every Ray node sees the data files and output folders at the same paths
        mode = config.trainer.v1.trainer_mode
        trainer_cls = ebpo_trainer_cls(mode)
        ours = functools.partial(trainer_cls, options=options)
        with swapped("verl.trainer.ppo.v1.trainer_base.TRAINER_REGISTRY", mode, ours):
            super().run(config)
