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
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import trl
from accelerate.utils import gather_object
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from ebpo_verl.algos import registry
from ebpo_verl.algos.registry import EstimatorSpec
from ebpo_verl.integrations.trl_block import (
    BLOCK_FILE,
    BUFFER_FILE,
    BlockLayout,
    block_settings,
    load_block,
    on_boundary,
)
from ebpo_verl.ops.atomic import atomic_write, atomic_write_text
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


class EstimatorMixin:
    """Put before ``GRPOTrainer`` (or a subclass of it): ``class T(EstimatorMixin, GRPOTrainer)``. Keywords:
    ``estimator`` (any of the package's registered estimators, :func:`ebpo_verl.algos.registry.ours`) and
    ``estimator_options`` (that estimator's options dataclass, e.g. ``EBPOOptions(...)``, or a mapping of its keys;
    None: the defaults). What it reads per row (its spec's ``row_source``): the dataset column its options name, or
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
        source = self.estimator_spec.row_source(self.estimator_options)
        if source is None:
            keys = None
        elif source.sample_index:
            keys = np.arange(len(rewards_per_func)) % group
        else:
            keys = self._gathered_column(inputs, source.field)
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
        """TRL's restore, then TRL's counter and block (checked for what TRL will read: :mod:`.trl_block`) and the
        estimator's state from ``checkpoint`` (every rank reads the same files, and its own block)."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        settings = block_settings(self.args, self.accelerator.num_processes)
        step, device, rank = self.state.global_step, self.accelerator.device, self.accelerator.process_index
        vocab = self.accelerator.unwrap_model(self.model).get_input_embeddings().num_embeddings
        layout = BlockLayout.of(self.args, vocab)
        self._step, self._buffered_inputs = load_block(
            checkpoint, settings, rank, device, step, layout, trl.__version__
        )
        if self.estimator_spec.stateful:
            load_state(self.estimator_spec, checkpoint, self.estimator.state, self.estimator_options, step)


class EstimatorGRPOTrainer(EstimatorMixin, GRPOTrainer):
    """TRL's ``GRPOTrainer`` with the advantages of one of the package's estimators (see :class:`EstimatorMixin`)."""
