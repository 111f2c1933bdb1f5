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
which every caller passes as the per-row values (the spec's ``row_input``: ``ebpo-train`` reads it from verl's
trajectory keys, TRL and the CPU study from each completion's place in its group); without them it is refused.
``order=rows`` walks the rows of each uid in the order the batch gives them (stock ``main_ppo``, which passes
no per-row values). Padding rows get 0 and are not walked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ebpo_verl.algos.estimator import Advantages, Batch
from ebpo_verl.algos.grouping import Groups, scatter_rows, sorted_sum
from ebpo_verl.algos.registry import SAMPLE_INDEX, EstimatorSpec
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
    ``(bs,)``; padding rows get 0; diagnostic ``krpo/baseline_mean`` (the mean filtered estimate x_j). With
    ``order=sample_index``, ``batch.row_values`` are the rows' rollout sample indices (ints; any value on padding
    rows), the walk's order, and required; with ``order=rows`` they are not read."""
    g = batch.uid_groups()
    if len(g.keys) == 0:
        return Advantages(scatter_rows(batch.scores, g, g.r), {})
    position = walk_positions(g, _sample_ints(batch, options, g.rows.numpy()))
    group, width = g.row_group.numpy(), int(g.size.max().item())
    grid = np.zeros((len(g.keys), width))
    grid[group, position] = g.r.numpy()
    q, r, p = float(options.process_noise), float(options.measurement_noise), float(options.p0)
    estimates, variances = np.empty_like(grid), np.empty(width)
    x = np.full(len(g.keys), float(options.x0))
    for j in range(width):  # K_j and P_j depend on (Q, R, P0) only: every group shares them
        prior = p + q
        gain = prior / (prior + r)
        p = variances[j] = (1.0 - gain) * prior
        x = x + gain * (grid[:, j] - x)
        estimates[:, j] = x  # columns beyond a group's size are never read back
    x_row = torch.from_numpy(estimates[group, position])
    adv = (g.r - x_row) / torch.from_numpy(np.sqrt(variances)[position] + float(options.epsilon))
    baseline_mean = (sorted_sum(x_row) / len(x_row)).item()
    return Advantages(scatter_rows(batch.scores, g, adv), {"krpo/baseline_mean": baseline_mean})


def _sample_ints(batch: Batch, options: KRPOOptions, rows: np.ndarray) -> np.ndarray | None:
    """The valid rows' sample indices as int64 (None: walk the row order, ``order=rows``); refused when
    ``order=sample_index`` and the caller passed none, or one is missing or not an integer (naming the row)."""
    if options.order != "sample_index":
        return None
    if batch.row_values is None:
        raise ValueError(
            "adv_estimator=krpo with algorithm.krpo.order=sample_index needs each row's rollout sample "
            "index (verl reorders rows by length before the advantage step): train with ebpo-train, which "
            "passes it, or set algorithm.krpo.order=rows to filter in the batch's row order"
        )
    values = np.asarray(batch.row_values, dtype=object)[rows]
    as_array = np.asarray(values.tolist())
    if as_array.dtype.kind in "iu" and as_array.shape == values.shape:
        return as_array.astype(np.int64)
    for row, value in zip(rows.tolist(), values.tolist(), strict=True):
        if is_missing(value) or not is_int(value):
            raise ValueError(f"krpo: row {row} has sample index {value!r}; expected an integer per valid row")
    return values.astype(np.int64)


SPECS = (
    EstimatorSpec(
        "krpo", "Kalman-filter baseline: a fresh scalar filter walks each group's rewards (not cross-step)",
        "arXiv 2505.07527 (KRPO); authors' code billhhh/KRPO_LLMs_RL train.py",
        compute=compute_krpo_advantages, options_cls=KRPOOptions, row_input=SAMPLE_INDEX,
    ),
)  # fmt: skip
