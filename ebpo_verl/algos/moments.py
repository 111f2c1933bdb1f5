"""Moments of a weighted series: count n, mean and sum of squared deviations M2, merged by Chan et al.'s parallel
update and down-weighted for exponential forgetting (numpy only, no verl import).

A :class:`Moments` holds floats (one series: the saved form) or equal-length numpy arrays (one series per element:
each method then works elementwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ebpo_verl.algos.state_codec import MAX_COUNT, MAX_SQUARES, MEAN, SQUARES, WEIGHT, Fixed

MOMENTS = Fixed(("n", "mean", "m2"), (WEIGHT, MEAN, SQUARES))
"""The saved form of :class:`Moments`: a weighted count, a mean and a sum of squared deviations."""


@dataclass
class Moments:
    """Weighted count ``n``, ``mean`` and sum of squared deviations ``m2`` (floats, or arrays of several series)."""

    n: Any = 0.0
    mean: Any = 0.0
    m2: Any = 0.0

    @classmethod
    def of_segments(
        cls, values: np.ndarray, segment: np.ndarray, n_segments: int, weight: np.ndarray | None = None
    ) -> Moments:
        """The moments of each segment's values (arrays of ``n_segments``; 0 where empty), two-pass. The sums run in
        the order of ``values``: give them sorted, and the result is independent of the row order."""
        n = np.bincount(segment, weights=weight, minlength=n_segments).astype(np.float64, copy=False)
        total = np.bincount(segment, weights=values if weight is None else values * weight, minlength=n_segments)
        mean = np.divide(total, n, out=np.zeros(n_segments), where=n > 0)
        dev = values - mean[segment]
        squares = dev * dev if weight is None else dev * dev * weight
        return cls(n, mean, np.bincount(segment, weights=squares, minlength=n_segments))

    @classmethod
    def stack(cls, series: Sequence[Moments]) -> Moments:
        """Several float moments as one of arrays."""
        return cls(*(np.array([getattr(m, f) for m in series], dtype=np.float64) for f in ("n", "mean", "m2")))

    def unstack(self) -> list[Moments]:
        """The float moments of each element of array moments (:meth:`stack` reversed)."""
        return [Moments(*row) for row in zip(self.n.tolist(), self.mean.tolist(), self.m2.tolist(), strict=True)]

    def variance(self) -> np.ndarray:
        """Population variance M2 / n (arrays; 0 where empty)."""
        return np.divide(self.m2, self.n, out=np.zeros(np.shape(self.n)), where=self.n > 0)

    def scaled(self, factor: float) -> Moments:
        """Down-weighted (exponential forgetting): the mean and variance are unchanged, the weight shrinks."""
        return Moments(self.n * factor, self.mean, self.m2 * factor)

    def merged(self, other: Moments) -> Moments:
        """Chan et al.'s parallel merge (floats, or arrays elementwise; empty + empty: zeros); n and M2 saturate at
        the edges of their saved domains (:data:`MOMENTS`)."""
        n = self.n + other.n
        some = n > 0
        safe = np.where(some, n, 1.0)
        delta = other.mean - self.mean
        mean = np.where(some, self.mean + delta * other.n / safe, 0.0)
        m2 = np.where(some, self.m2 + other.m2 + delta * delta * self.n * other.n / safe, 0.0)
        merged = Moments(np.where(some, np.minimum(n, MAX_COUNT), 0.0), mean, np.minimum(m2, MAX_SQUARES))
        return merged if np.ndim(n) else Moments.from_json(merged.row())

    def finite(self) -> bool:
        return bool(np.isfinite(self.n).all() and np.isfinite(self.mean).all() and np.isfinite(self.m2).all())

    def row(self) -> list[float]:
        """The saved ``[n, mean, m2]``."""
        return [self.n, self.mean, self.m2]

    @classmethod
    def from_json(cls, data: list[float]) -> Moments:
        """A saved ``[n, mean, m2]`` (checked: :data:`MOMENTS`)."""
        return cls(*map(float, data))
