"""KRPO: a Kalman-filter baseline per prompt group (torch / numpy, no verl import).

Wang et al., "Kalman Filter Enhanced GRPO for Reinforcement Learning-Based Language Model Reasoning",
arXiv 2505.07527 (v5), Sec. 3 and the authors' ``train.py`` (``billhhh/KRPO_LLMs_RL``). Not cross-step: every
prompt group of every step gets a fresh scalar filter from (x, P) = (x0, P0) and walks its rewards in order
j = 1..G: P- = P + Q; K = P- / (P- + R); x = x + K (r_j - x); P = (1 - K) P-; then
A_j = (r_j - x) / (sqrt(P) + 1e-8), with x and P already including r_j. Defaults are the authors': x0 = 0,
P0 = 1, Q = 1e-5, R = 1e-2. The advantages are about 10x GRPO's scale; an all-zero group gets exactly 0.

The result depends on the order of a group's responses, and verl reorders the batch's rows by sequence length
(``_balance_batch``) before the advantage step, so the row order within a uid is correlated with response length
and hence with correctness. ``order=sample_index`` (default) walks each group by the rollout's sample index,
which the caller passes as the per-row values (``ebpo-train`` reads it from verl's row key
``{uid}_{session_id}_{index}``: the session id is the sample's index in [0, n)); without them it is refused.
``order=rows`` walks the rows of each uid in the order the batch gives them (stock ``main_ppo``, which passes
no per-row values). Padding rows get 0 and are not walked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from ebpo_verl.algos.estimator import Advantages, Batch, Estimator
from ebpo_verl.algos.grouping import Groups, scatter_rows, sorted_sum
from ebpo_verl.algos.registry import EstimatorSpec
from ebpo_verl.options.parsing import OptionSection, is_int, is_missing, option, reals

ORDERS = ("sample_index", "rows")


@dataclass(frozen=True)
class KRPOOptions(OptionSection):
    """Options of the ``krpo`` estimator (``algorithm.krpo.<key>``); defaults = the authors' ``train.py``."""

    SECTION: ClassVar[str] = "algorithm.krpo"

    process_noise: float = option(1e-5, "Q, the filter's process noise (authors: 1e-5)", rule=reals(0.0))
    measurement_noise: float = option(
        1e-2, "R, the filter's measurement noise (authors: 1e-2)", rule=reals(0.0, open_low=True)
    )
    x0: float = option(0.0, "the filter's initial estimate of each group's reward (authors: 0)", rule=reals())
    p0: float = option(1.0, "the filter's initial variance (authors: 1)", rule=reals(0.0))
    epsilon: float = option(1e-8, "added to sqrt(P) in the division (authors: 1e-8)", rule=reals(0.0, open_low=True))
    order: str = option(
        "sample_index",
        "the order a group's rewards are filtered in: sample_index (the rollout's, passed per row by ebpo-train; "
        "refused without it) or rows (the batch's row order, after verl's length balancing)",
        choices=ORDERS,
    )


def filter_gains(steps: int, options: KRPOOptions) -> tuple[np.ndarray, np.ndarray]:
    """(K_j, P_j) for j = 1..steps: the gains and posterior variances depend on (Q, R, P0) only, not on the
    rewards, so every group shares them."""
    q, r, p = float(options.process_noise), float(options.measurement_noise), float(options.p0)
    gains, variances = np.empty(steps), np.empty(steps)
    for j in range(steps):
        prior = p + q
        gains[j] = prior / (prior + r)
        p = (1.0 - gains[j]) * prior
        variances[j] = p
    return gains, variances


def walk_positions(g: Groups, sample_index: np.ndarray | None) -> np.ndarray:
    """Each valid row's position in its group's walk: by ``sample_index`` (one int per valid row; ties refused),
    else by row order."""
    group = g.row_group.numpy()
    key = np.arange(len(group)) if sample_index is None else sample_index
    order = np.lexsort((key, group))
    position = np.empty(len(group), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(g.size.numpy().astype(np.int64))[:-1]])
    position[order] = np.arange(len(group)) - starts[group[order]]
    if sample_index is not None:
        sorted_key, sorted_group = key[order], group[order]
        tie = (sorted_key[1:] == sorted_key[:-1]) & (sorted_group[1:] == sorted_group[:-1])
        if tie.any():
            raise ValueError(
                f"krpo: two responses of uid {g.keys[sorted_group[1:][tie][0]]!r} have the same sample index "
                f"{sorted_key[1:][tie][0]}: the filter's order would be ambiguous; use algorithm.krpo.order=rows"
            )
    return position


def compute_krpo_advantages(batch: Batch, options: KRPOOptions) -> Advantages:
    """KRPO advantages A_j = (r_j - x_j) / (sqrt(P_j) + eps) of each group's filter (module doc), shape
    ``(bs,)``; padding rows get 0; diagnostic ``krpo/baseline_mean`` (the mean filtered estimate x_j).

    Args:
        batch: the rows grouped by uid ``index`` (padding: ``valid`` False or a uid starting with ``pad_prefix``);
            with ``order=sample_index``, ``row_values`` are the rows' rollout sample indices (ints; any value on
            padding rows), the walk's order, and required; with ``order=rows`` they are not read.
        options: estimator options.
    """
    sample_index = _sample_index(batch, options)
    g = batch.uid_groups()
    if len(g.keys) == 0:
        return Advantages(scatter_rows(batch.scores, g, g.r), {})
    sample = None if sample_index is None else _sample_ints(sample_index, g.rows.numpy())
    position = walk_positions(g, sample)
    group, width = g.row_group.numpy(), int(g.size.max().item())
    grid = np.zeros((len(g.keys), width))
    grid[group, position] = g.r.numpy()
    gains, variances = filter_gains(width, options)
    estimates = np.empty_like(grid)
    x = np.full(len(g.keys), float(options.x0))
    for j in range(width):  # columns beyond a group's size are never read back
        x = x + gains[j] * (grid[:, j] - x)
        estimates[:, j] = x
    x_row = torch.from_numpy(estimates[group, position])
    adv = (g.r - x_row) / torch.from_numpy(np.sqrt(variances)[position] + float(options.epsilon))
    baseline_mean = (sorted_sum(x_row) / len(x_row)).item()
    return Advantages(scatter_rows(batch.scores, g, adv), {"krpo/baseline_mean": baseline_mean})


def _sample_index(batch: Batch, options: KRPOOptions) -> Sequence[Any] | np.ndarray | None:
    """The rows' sample indices the walk follows (None: the row order, ``order=rows``); refused when
    ``order=sample_index`` and the caller passed none."""
    if options.order != "sample_index":
        return None
    if batch.row_values is None:
        raise ValueError(
            "adv_estimator=krpo with algorithm.krpo.order=sample_index needs each row's rollout sample "
            "index (verl reorders rows by length before the advantage step): train with ebpo-train, which "
            "passes it, or set algorithm.krpo.order=rows to filter in the batch's row order"
        )
    return batch.row_values


def _sample_ints(sample_index: Sequence[Any] | np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The valid rows' sample indices as int64; a missing or non-integer one raises naming the row."""
    values = np.asarray(sample_index, dtype=object)[rows]
    as_array = np.asarray(values.tolist())
    if as_array.dtype.kind in "iu" and as_array.shape == values.shape:
        return as_array.astype(np.int64)
    for row, value in zip(rows.tolist(), values.tolist(), strict=True):
        if is_missing(value) or not is_int(value):
            raise ValueError(f"krpo: row {row} has sample index {value!r}; expected an integer per valid row")
    return values.astype(np.int64)


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
            raise ValueError(f"krpo: trajectory key {key!r:.200} is not verl's {{uid}}_{{session_id}}_{{index}}")
        out[row] = int(match.group(1))
    return out


class KRPOEstimator(Estimator):
    """The ``krpo`` estimator: its options and the last call's ``krpo/*`` diagnostics (no state: a fresh filter per
    group per step). With ``order=sample_index``, ``row_values`` are the per-row rollout sample indices
    (:attr:`reads_sample_index`: the trainer passes :func:`sample_indices` of the step's trajectory keys)."""

    @property
    def reads_sample_index(self) -> bool:
        """Whether the caller must pass each row's rollout sample index as ``row_values``."""
        return self.options.order == "sample_index"

    pure_function = staticmethod(compute_krpo_advantages)


SPECS = (
    EstimatorSpec(
        "krpo",
        "Kalman-filter baseline: a fresh scalar filter walks each group's rewards (not cross-step)",
        "arXiv 2505.07527 (KRPO); authors' code billhhh/KRPO_LLMs_RL train.py",
        options_cls=KRPOOptions,
        estimator_cls=KRPOEstimator,
        # the CPU study samples a group's responses in order and passes no sample index: its rows are in the
        # rollout's order, so the study's krpo walks them as given
        study_variants={"krpo": {"order": "rows"}},
    ),
)
