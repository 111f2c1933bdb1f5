"""The package's advantage estimators in Hugging Face TRL's ``GRPOTrainer`` (``pip install 'ebpo-verl[trl]'``).

TRL computes GRPO's advantages inline in ``GRPOTrainer._generate_and_score_completions`` from the rewards that
``_calculate_rewards`` gathers across processes. :class:`EstimatorMixin` wraps both (``super()``, nothing of
TRL's copied) and replaces this process's slice of ``advantages`` (and TRL's logged ones) with the estimator's,
computed in float64 on CPU from the same gathered values on every rank, so every rank ends with the same state,
which each checkpoint folder holds and ``train(resume_from_checkpoint=...)`` restores under verl's mismatch rules
(:mod:`ebpo_verl.trainer.checkpoint.state`). Evaluation runs on a copy; the diagnostics go into TRL's metrics.
docs/trl.md is the user's page.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from ebpo_verl.algos import registry
from ebpo_verl.algos.registry import EstimatorSpec
from ebpo_verl.ops.atomic import atomic_write, atomic_write_text
from ebpo_verl.ops.errors import one_line
from ebpo_verl.trainer.checkpoint.state import load_state, save_state


def lookup(name: str) -> EstimatorSpec:
    """The registered estimator called ``name`` (:func:`ebpo_verl.algos.registry.get`), one of the package's own;
    ValueError in one line otherwise."""
    spec = registry.get(name)
    if spec.builtin:
        raise ValueError(
            f"{name} is verl's own estimator, not one of ebpo-verl's: use TRL's GRPOTrainer as it is, or one of "
            f"{', '.join(registry.ours())}"
        )
    return spec


def parse_options(spec: EstimatorSpec, options: Any) -> Any:
    """:meth:`EstimatorSpec.options_of`, with a warning naming the options the estimator's mode ignores, as under
    verl."""
    options = spec.options_of(options)
    spec.warn_ignored(options, stacklevel=3)
    return options


def row_field(row: Mapping[str, Any], column: str) -> Any:
    """``row[column]``, or for a dotted ``column`` (``extra_info.index``) the nested field; KeyError if absent."""
    if column in row:
        return row[column]
    value: Any = row
    for part in column.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(column)
        value = value[part]
    return value


def check_column(dataset: Any, column: str, unique: bool, option: str) -> None:
    """Every row of ``dataset`` has ``column`` (top-level or dotted), unique per row when ``unique``; ValueError
    in one line naming the first offending row. A dataset without ``len`` (streaming) is not checked."""
    if dataset is None or not hasattr(dataset, "__len__"):
        return
    seen: dict[str, int] = {}
    for i, row in enumerate(dataset):
        try:
            value = row_field(row, column)
        except KeyError:
            raise ValueError(
                f"{option}={column!r}: row {i} of the training set has no such column (name a top-level column or "
                "a dotted path such as extra_info.index)"
            ) from None
        key = str(value)
        if unique and key in seen:
            raise ValueError(
                f"{option}={column!r} must identify a prompt, but rows {seen[key]} and {i} share the value {key!r}: "
                "name a column unique per prompt"
            )
        seen[key] = i


def on_boundary(micro_step: int, settings: Mapping[str, int]) -> bool:
    """Whether TRL's micro-step counter (``GRPOTrainer._step``) is at a generation block's end: a multiple of
    ``steps_per_generation x num_iterations`` (not ``global_step x gradient_accumulation_steps``: Transformers ends an
    epoch whose micro-batches are not a multiple of the accumulation with a shorter update)."""
    return micro_step % (settings["steps_per_generation"] * settings["num_iterations"]) == 0


BLOCK_FILE = "trl_block.json"
"""TRL's micro-step counter and block settings at a save, in every checkpoint folder the mixin writes."""
BUFFER_FILE = "trl_block_rank{}.pt"
"""A process's generated block (TRL's ``_buffered_inputs``), written by every process at a save inside a block."""


def block_settings(args: Any, processes: int) -> dict[str, int]:
    """The settings that place TRL's blocks and its data position: a resume must keep them."""
    names = ("gradient_accumulation_steps", "steps_per_generation", "num_iterations")
    return {**{name: int(getattr(args, name)) for name in names}, "processes": int(processes)}


def load_block(folder: str, settings: dict[str, int], rank: int, device: Any) -> tuple[int, list[Any] | None]:
    """TRL's counter at the save in ``folder`` and, when it lies inside a block, this process's generated block
    (None at a boundary: TRL generates anew). ValueError in one line for a missing or malformed file or a changed
    block setting."""
    path = os.path.join(folder, BLOCK_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except FileNotFoundError:
        raise ValueError(
            f"{path} is missing: resume from a checkpoint written by ebpo-verl's TRL integration (it records TRL's "
            "micro-step counter, which places the generation blocks)"
        ) from None
    except (ValueError, RecursionError) as err:
        raise ValueError(f"{path} is not valid JSON ({one_line(err)}): resume from an intact checkpoint") from None
    keys = {"micro_step", *settings}
    counts = isinstance(saved, dict) and set(saved) == keys and all(type(v) is int and v >= 0 for v in saved.values())
    if not counts:
        raise ValueError(f"{path} is malformed: expected non-negative integers {', '.join(sorted(keys))}")
    changed = [f"{k} {saved[k]} -> {v}" for k, v in settings.items() if saved[k] != v]
    if changed:
        raise ValueError(
            f"{path}: {', '.join(changed)} since the save: TRL's data position and generation blocks would not line "
            "up with the saved ones; resume with the saved settings"
        )
    micro = saved["micro_step"]
    if on_boundary(micro, settings):
        return micro, None
    buffer = os.path.join(folder, BUFFER_FILE.format(rank))
    if not os.path.isfile(buffer):
        raise ValueError(
            f"{buffer} is missing: the checkpoint lies inside a generation block (micro-step {micro}) and the "
            "block's completions are needed to continue it; resume from a checkpoint at a block's end"
        )
    try:
        block = torch.load(buffer, map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as err:
        raise ValueError(f"{buffer} is not a weights-only block of tensors ({one_line(err)})") from None
    if not isinstance(block, list) or len(block) != settings["steps_per_generation"]:
        expected = settings["steps_per_generation"]
        raise ValueError(f"{buffer} is malformed: expected a list of steps_per_generation={expected} batches")
    return micro, block


class EstimatorMixin:
    """Put before ``GRPOTrainer`` (or a subclass of it): ``class T(EstimatorMixin, GRPOTrainer)``. Keywords:
    ``estimator`` (any of the package's registered estimators, :func:`ebpo_verl.algos.registry.ours`) and
    ``estimator_options`` (that estimator's options dataclass, e.g. ``EBPOOptions(...)``, or a mapping of its keys;
    None: the defaults). What it reads per row (``registry.row_values``): the dataset column its options name, or
    each completion's sample index, its place in its group (TRL's completions of a prompt come in sample order)."""

    def __init__(self, *args: Any, estimator: str = "ebpo", estimator_options: Any = None, **kwargs: Any) -> None:
        self.estimator_spec = lookup(estimator)
        self.estimator_options = parse_options(self.estimator_spec, estimator_options)
        self.estimator = registry.new_estimator(self.estimator_spec, self.estimator_options)
        self._gathered: tuple[torch.Tensor, np.ndarray | None] | None = None
        super().__init__(*args, **kwargs)
        if self.args.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                f"multi_objective_aggregation={self.args.multi_objective_aggregation!r}: the {estimator} estimator "
                "scores the weighted sum of the rewards; use multi_objective_aggregation='sum_then_normalize'"
            )
        self.row_column = self.estimator_spec.row_key_of(self.estimator_options)
        if self.row_column is not None:  # checked on the training set
            option = f"{estimator}.{self.estimator_spec.row_key}"
            check_column(self.train_dataset, self.row_column, self.estimator_spec.unique_row_key, option)

    def _calculate_rewards(self, inputs: list[dict[str, Any]], *args: Any, **kwargs: Any) -> torch.Tensor:
        """TRL's gathered ``rewards_per_func``, kept with what the estimator reads per row: the row column gathered in
        the same process order, or each completion's place in its group."""
        rewards_per_func = super()._calculate_rewards(inputs, *args, **kwargs)
        group = self.num_generations if self.model.training else self.num_generations_eval
        keys = registry.row_values(
            self.estimator_spec,
            self.estimator_options,
            lambda column: self._gathered_column(inputs, column),
            lambda: np.arange(len(rewards_per_func)) % group,
        )
        self._gathered = (rewards_per_func, keys)
        return rewards_per_func

    def _gathered_column(self, inputs: list[dict[str, Any]], column: str) -> np.ndarray:
        """``column`` of every process's rows, gathered in process order."""
        try:
            local = [row_field(x, column) for x in inputs]
        except KeyError:
            raise ValueError(
                f"a row of this {'training' if self.model.training else 'evaluation'} batch has no column "
                f"{column!r} ({self.estimator_spec.name}.{self.estimator_spec.row_key}): every dataset "
                "the trainer reads needs it"
            ) from None
        return np.asarray(gather_object(local), dtype=object)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """TRL's step, then this process's slice of the estimator's advantages in place of TRL's."""
        self._gathered = None
        output = super()._generate_and_score_completions(inputs)
        if self._gathered is None:
            raise RuntimeError("TRL did not call _calculate_rewards: use the TRL version ebpo-verl[trl] pins")
        advantages = self.estimate(*self._gathered, self.model.training)
        self._gathered = None
        local = output["advantages"]
        start = self.accelerator.process_index * len(local)
        output["advantages"] = advantages[start : start + len(local)].to(local.device, local.dtype)
        logged = self._logs["advantages"]
        for _ in range(min(len(advantages), len(logged))):
            logged.pop()
        logged.extend(advantages.tolist())
        return output

    def estimate(self, rewards_per_func: torch.Tensor, keys: np.ndarray | None, train: bool) -> torch.Tensor:
        """The advantages of every gathered row (float64, CPU), from TRL's weighted reward sum; a row whose every
        reward is NaN (unscorable) is padding: advantage 0, no state update. Training updates the estimator's
        state; evaluation uses a copy. The diagnostics go into TRL's metrics of the mode."""
        values = rewards_per_func.detach().to("cpu", torch.float64)
        weights = self.reward_weights.detach().to("cpu", torch.float64)
        valid = ~torch.isnan(values).all(dim=1)
        scores = torch.where(valid, (values * weights).nansum(dim=1), torch.zeros((), dtype=torch.float64))
        group = self.num_generations if train else self.num_generations_eval
        index = np.asarray([f"group{i // group}" for i in range(len(scores))], dtype=object)
        estimator = self.estimator if train else copy.deepcopy(self.estimator)
        result = estimator(scores, index, valid, keys)
        metrics = self._metrics["train" if train else "eval"]
        for name, value in result.diagnostics.items():
            metrics[name].append(float(value))
        return result.values.to(torch.float64)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Before TRL writes the rest: TRL's micro-step counter (and, inside a generation block, each process's
        generated block, so that a resume continues the block instead of regenerating it) and the estimator's state,
        which then includes every block TRL has generated."""
        step = self.state.global_step
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{step}")
        settings = block_settings(self.args, self.accelerator.num_processes)
        writer = self.args.should_save
        os.makedirs(folder, exist_ok=True)
        if not on_boundary(self._step, settings):
            buffer = os.path.join(folder, BUFFER_FILE.format(self.accelerator.process_index))
            atomic_write(buffer, lambda tmp: torch.save(self._buffered_inputs, tmp))
        if writer:
            text = json.dumps({"micro_step": int(self._step), **settings}, sort_keys=True) + "\n"
            atomic_write_text(os.path.join(folder, BLOCK_FILE), text)
        if self.estimator_spec.stateful and writer:
            save_state(self.estimator_spec, folder, self.estimator.state, self.estimator_options, step)
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """TRL's restore, then TRL's counter and block and the estimator's state from ``checkpoint`` (every rank reads
        the same files, and its own block)."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        settings = block_settings(self.args, self.accelerator.num_processes)
        device = self.accelerator.device
        self._step, self._buffered_inputs = load_block(checkpoint, settings, self.accelerator.process_index, device)
        if self.estimator_spec.stateful:
            step = self.state.global_step
            load_state(self.estimator_spec, checkpoint, self.estimator.state, self.estimator_options, step)


class EstimatorGRPOTrainer(EstimatorMixin, GRPOTrainer):
    """TRL's ``GRPOTrainer`` with the advantages of one of the package's estimators (see :class:`EstimatorMixin`)."""
