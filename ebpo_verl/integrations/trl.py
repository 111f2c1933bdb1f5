"""The package's advantage estimators in Hugging Face TRL's ``GRPOTrainer`` (``pip install 'ebpo-verl[trl]'``).

TRL computes GRPO's advantages inline in ``GRPOTrainer._generate_and_score_completions`` from the rewards that
``_calculate_rewards`` gathers across processes. :class:`EstimatorMixin` wraps both (``super()``, nothing of
TRL's copied): it keeps the gathered rewards and the gathered prompt keys, lets TRL finish the step, then replaces
this process's slice of ``advantages`` (and TRL's logged advantages) with the estimator's, computed in float64 on
CPU from the same gathered values on every rank, so every rank ends with the same state. The estimator's state is
written into each checkpoint folder (by the saving process only) and restored on
``train(resume_from_checkpoint=...)`` under the same mismatch rules as under verl
(:mod:`ebpo_verl.trainer.checkpoint.state`); evaluation runs on a copy and changes no state. The ``ebpo/*``
(``spo/*``, ``dbb/*``) diagnostics go into TRL's own metrics. docs/trl.md is the user's page.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from ebpo_verl.algos import registry
from ebpo_verl.algos.registry import EstimatorSpec
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
    """``options`` as the estimator's options dataclass: an instance as is, a mapping validated by its
    ``from_mapping`` (one-line ValueError naming the key), None the defaults; None for an estimator without
    options (:meth:`EstimatorSpec.options_of`). The options the estimator's mode ignores are named in a warning,
    as under verl."""
    options = spec.options_of(options)
    message = spec.warning(options) if spec.warning is not None else None
    if message:
        warnings.warn(f"{spec.name.upper()}: {message}", RuntimeWarning, stacklevel=3)
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


def on_boundary(global_step: int, args: Any) -> bool:
    """Whether optimizer step ``global_step`` ends a generation block (TRL generates once per ``steps_per_generation
    x num_iterations`` micro-steps and regenerates a partly used block on resume)."""
    micro = global_step * args.gradient_accumulation_steps
    return micro % (args.steps_per_generation * args.num_iterations) == 0


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
        self._block_state: Any = None
        super().__init__(*args, **kwargs)
        self._check_setup(estimator)

    def _check_setup(self, name: str) -> None:
        """Refuse what the estimator cannot replace, name the row column and check it on the training set."""
        if self.args.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                f"multi_objective_aggregation={self.args.multi_objective_aggregation!r}: the {name} estimator scores "
                "the weighted sum of the rewards; use multi_objective_aggregation='sum_then_normalize'"
            )
        key = self.estimator_spec.row_key
        self.row_column = self.estimator_spec.row_key_of(self.estimator_options)
        if self.row_column is not None:
            check_column(self.train_dataset, self.row_column, self.estimator_spec.unique_row_key, f"{name}.{key}")
        steps = self.args.save_steps
        if self.args.save_strategy == "steps" and steps >= 1 and not on_boundary(int(steps), self.args):
            raise ValueError(
                f"save_steps={steps} is not a multiple of the generation block (steps_per_generation x num_iterations "
                "/ gradient_accumulation_steps optimizer steps): a checkpoint inside a block is regenerated on resume "
                "and the estimator's state would differ; choose save_steps on a block boundary"
            )

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
        rewards_per_func, keys = self._gathered
        self._gathered = None
        train = self.model.training
        advantages = self.estimate(rewards_per_func, keys, train)
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
        if train and self.estimator.state is not None:
            self._block_state = copy.deepcopy(self.estimator.state)
        estimator = self.estimator if train else copy.deepcopy(self.estimator)
        result = estimator(scores, index, valid, keys)
        metrics = self._metrics["train" if train else "eval"]
        for name, value in result.diagnostics.items():
            metrics[name].append(float(value))
        return result.values.to(torch.float64)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """The estimator's state into the checkpoint folder (saving process only), before TRL writes the rest."""
        if self.estimator_spec.stateful and self.args.should_save:
            step = self.state.global_step
            state = self.estimator.state
            if not on_boundary(step, self.args):
                warnings.warn(
                    f"checkpoint at step {step} lies inside a generation block: it holds the estimator's state from "
                    "the block's start, and TRL regenerates the block on resume",
                    RuntimeWarning,
                    stacklevel=2,
                )
                state = self._block_state if self._block_state is not None else state
            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{step}")
            save_state(self.estimator_spec, folder, state, self.estimator_options, step)
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """TRL's restore, then the estimator's state from ``checkpoint`` (every rank reads the same file)."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None and self.estimator_spec.stateful:
            step = self.state.global_step
            load_state(self.estimator_spec, checkpoint, self.estimator.state, self.estimator_options, step)


class EstimatorGRPOTrainer(EstimatorMixin, GRPOTrainer):
    """TRL's ``GRPOTrainer`` with the advantages of one of the package's estimators (see :class:`EstimatorMixin`)."""
