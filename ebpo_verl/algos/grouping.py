"""Grouping of a batch's rows by a key, order-free sums and the two-level reward detector, shared by every estimator
(numpy / torch only, no verl import).

Keys (uids, prompt keys, cluster labels) are compared as strings and factorised once with pandas' hash tables (no
per-row string conversion). Every sum runs over values in sorted order, so results do not depend on the order of
the rows nor on the key strings (a resumed run sees fresh uids).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from ebpo_verl.ops.errors import shorten

REWARD_LIMIT = 1e30
"""The largest reward magnitude an estimator accepts: far above any reward's scale, far enough below float64's
overflow (1.8e308) that every square, variance and running sum over 2**53 rewards stays finite."""


def factorize_keys(values: np.ndarray, missing: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Codes and unique names of ``values`` compared as strings (pandas' hash table on the objects, then on the
    few distinct names); with ``missing``, None/NaN get code -1."""
    codes, uniques = pd.factorize(values, use_na_sentinel=missing)
    names = np.asarray(uniques, dtype=object)
    if pd.api.types.infer_dtype(names, skipna=False) != "string":  # not all str: compare their text
        names = names.astype(str)
        if len(set(names.tolist())) != len(names):  # distinct objects with the same text (1 and "1") are one
            merged, distinct = pd.factorize(names)
            codes = np.where(codes >= 0, merged[codes], -1)
            names = np.asarray(distinct, dtype=object)
        names = names.astype(object)
    return codes.astype(np.int64, copy=False), names


def sorted_mean(values: np.ndarray) -> float:
    """Mean summed in value order (independent of the order of the rows)."""
    return float(np.sort(values).sum() / values.size)


def sorted_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum in value order (independent of the order of the rows)."""
    return torch.sort(values).values.sum()


def standardise(adv: torch.Tensor, eps: float) -> torch.Tensor:
    """(A - mean) / (unbiased std + eps) over the batch; a single row gets 0."""
    n = adv.numel()
    mean = sorted_sum(adv) / n
    var = sorted_sum((adv - mean) ** 2) / (n - 1) if n >= 2 else torch.zeros((), dtype=adv.dtype)
    return (adv - mean) / (var.sqrt() + eps)


@dataclass
class Groups:
    """The valid rows of a batch grouped by key: rewards (float64), row -> group, per-group size and moments."""

    rows: torch.Tensor  # positions of the valid rows in the batch
    r: torch.Tensor  # their rewards
    row_group: torch.Tensor  # group of each valid row
    keys: np.ndarray  # sorted group keys (str)
    size: torch.Tensor  # responses per group
    mean: torch.Tensor  # group mean reward
    var: torch.Tensor  # unbiased within-group variance (0 for a group of one)

    def keys_of(self, rows: np.ndarray) -> list[str]:
        """Sorted distinct keys of the valid rows selected by the bool mask ``rows`` (for error messages)."""
        return sorted(set(self.keys[self.row_group.numpy()[rows]].tolist()))


def pass_levels(g: Groups, refusal: str, fractions: bool = True) -> tuple[float, float]:
    """(lowest level, span) of a two-level reward: 0/1 (with ``fractions``, any value in [0, 1]) -> (0, 1), the
    paper's -1/+1 -> (-1, 2); any other reward raises ValueError(the estimator's own message: the template
    ``refusal`` with ``values``, the first 8 distinct values, ``more``, " ..." when there are more, and ``keys``, the
    first 20 keys of the groups holding off-level values). Off-level: outside [0, 1] with ``fractions``; else values
    other than -1, 0 and 1, or, when there are none, the 0s (-1/0/1 has three levels)."""
    r = g.r.numpy()
    if (((r >= 0.0) & (r <= 1.0)) if fractions else ((r == 0.0) | (r == 1.0))).all():
        return 0.0, 1.0
    if ((r == -1.0) | (r == 1.0)).all():
        return -1.0, 2.0
    bad = (r < 0.0) | (r > 1.0) if fractions else (r != 0.0) & (r != 1.0) & (r != -1.0)
    if not fractions and not bad.any():
        bad = r == 0.0
    values = torch.unique(g.r).tolist()
    more = " ..." if len(values) > 8 else ""
    raise ValueError(refusal.format(values=values[:8], more=more, keys=g.keys_of(bad)[:20]))


def group_rows(
    scores: torch.Tensor,
    keys: Sequence[Any] | np.ndarray,
    valid: torch.Tensor,
    what: str,
    pad_prefix: str | None = None,
    uids: Sequence[Any] | np.ndarray | None = None,
) -> Groups:
    """Group the valid rows by ``keys`` (compared as strings); rows whose uid (``uids``, default ``keys``) starts
    with ``pad_prefix`` are padding too; a valid row without a key (None/NaN) and NaN/inf rewards raise, naming
    ``what``; so do rewards beyond :data:`REWARD_LIMIT`."""
    bs = scores.shape[0]
    key_arr = np.asarray(keys, dtype=object)
    if key_arr.shape != (bs,) or tuple(valid.shape) != (bs,):
        raise ValueError(f"{what} {key_arr.shape} and valid {tuple(valid.shape)} must have shape ({bs},)")
    valid_np = valid.detach().cpu().numpy().astype(bool)
    codes, names = factorize_keys(key_arr, missing=True)  # None, NaN, pandas NA -> -1
    if pad_prefix is not None:  # verl's ``pad`` rows, by their uid
        pad_codes, pad_names = (codes, names) if uids is None else factorize_keys(np.asarray(uids, dtype=object))
        if "\0" + pad_prefix in "\0" + "\0".join(pad_names.tolist()):  # per distinct uid, not per row
            is_pad = np.strings.startswith(pad_names.astype(str), pad_prefix)
            valid_np &= ~(is_pad[pad_codes] & (pad_codes >= 0))
    rows_np = np.flatnonzero(valid_np)
    codes = codes[rows_np]
    missing = codes < 0
    if missing.any():
        first = rows_np[missing][:10].tolist()
        raise ValueError(f"{int(missing.sum())} valid row(s) have no {what} (None/NaN); first rows: {first}")
    used = np.bincount(codes, minlength=len(names)) > 0
    if not used.all():  # names of padding rows only
        codes = (np.cumsum(used) - 1)[codes]
        names = names[used]
    names = names.astype(str)
    rows = torch.from_numpy(rows_np)
    r = scores.detach().to(torch.float64).cpu().index_select(0, rows)
    order = np.argsort(names, kind="stable")  # sorted keys: the same groups whatever the row order
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    group_keys = names[order]
    bad = ~(r.abs() <= REWARD_LIMIT)
    if bool(bad.any()):
        offenders = sorted(set(group_keys[rank[codes[bad.numpy()]]].tolist()))
        raise ValueError(
            f"non-finite (NaN/inf) rewards or rewards beyond +-{REWARD_LIMIT:g} for {what} {shorten(offenders)}: "
            "check the reward function (scale it down)"
        )
    row_group = torch.from_numpy(rank[codes].astype(np.int64, copy=False))
    size, mean, var = _group_moments(r, row_group, len(group_keys))
    return Groups(rows, r, row_group, group_keys, size, mean, var)


def _group_moments(r: torch.Tensor, row_group: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
    """(size, mean, unbiased variance) per group, summed in value order (independent of the row order)."""
    r_sorted, r_order = torch.sort(r, stable=True)
    g_sorted = row_group.index_select(0, r_order)
    size = torch.zeros(n, dtype=torch.float64).index_add_(0, g_sorted, torch.ones_like(r))
    mean = torch.zeros(n, dtype=torch.float64).index_add_(0, g_sorted, r_sorted) / size.clamp_min(1.0)
    dev = r_sorted - mean.index_select(0, g_sorted)
    m2 = torch.zeros(n, dtype=torch.float64).index_add_(0, g_sorted, dev * dev)
    var = torch.where(size >= 2, m2 / (size - 1).clamp_min(1.0), torch.zeros_like(m2))
    return size, mean, var


def scatter_rows(scores: torch.Tensor, g: Groups, adv: torch.Tensor) -> torch.Tensor:
    """Advantages of the valid rows at their batch positions, 0 elsewhere; dtype of ``scores`` if floating.
    ValueError when one is not finite or does not fit that dtype (fp16 holds at most 65504: no silent inf)."""
    dtype = scores.dtype if scores.is_floating_point() else torch.get_default_dtype()
    largest = adv.abs().max().item() if adv.numel() else 0.0
    if not math.isfinite(largest):
        raise ValueError(
            f"the estimator gave non-finite advantages (NaN/inf) from finite rewards, for {shorten(g.keys.tolist())}: "
            "a bug of the estimator; please report it with these rewards"
        )
    if largest > torch.finfo(dtype).max:
        raise ValueError(
            f"advantages as large as {largest:.3g} do not fit {dtype} (largest {torch.finfo(dtype).max:.3g}): give the "
            "scores as float32 or float64, or pick options that keep the advantages smaller"
        )
    out = torch.zeros(scores.shape[0], dtype=dtype, device=scores.device)
    return out.index_copy_(0, g.rows.to(out.device), adv.to(dtype=dtype, device=scores.device))
