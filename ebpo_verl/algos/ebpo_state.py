"""The ``ebpo`` estimator's running statistics (Welford / Chan moments per scope) and their saved form."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ebpo_verl.algos.estimator import FreshState
from ebpo_verl.algos.state_codec import (
    COUNT,
    MAX_COUNT,
    MAX_SQUARES,
    MEAN,
    SQUARES,
    WEIGHT,
    Fixed,
    Record,
    Table,
    decode,
)

STATE_VERSION = 1
COUNTS = ("steps", "prompts_seen", "responses_seen")
MOMENTS = Fixed(("n", "mean", "m2"), (WEIGHT, MEAN, SQUARES))
"""The saved form of :class:`Moments`: a weighted count, a mean and a sum of squared deviations."""


def merge_tables(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Chan et al.'s parallel merge of (..., 3) tables of (n, mean, M2), elementwise (empty + empty: zeros); n and M2
    saturate at the edges of their saved domains (:data:`MOMENTS`)."""
    a_n, a_mean, a_m2 = a[..., 0], a[..., 1], a[..., 2]
    b_n, b_mean, b_m2 = b[..., 0], b[..., 1], b[..., 2]
    n = a_n + b_n
    some = n > 0
    safe = np.where(some, n, 1.0)
    delta = b_mean - a_mean
    mean = np.where(some, a_mean + delta * b_n / safe, 0.0)
    m2 = np.where(some, a_m2 + b_m2 + delta * delta * a_n * b_n / safe, 0.0)
    return np.stack([np.where(some, np.minimum(n, MAX_COUNT), 0.0), mean, np.minimum(m2, MAX_SQUARES)], axis=-1)


@dataclass
class Moments:
    """Weighted count, mean and sum of squared deviations (M2); merged with Chan et al.'s parallel formula."""

    n: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def row(self) -> list[float]:
        return [self.n, self.mean, self.m2]

    def scaled(self, factor: float) -> Moments:
        """Down-weight (exponential forgetting): the mean and variance are unchanged, the weight shrinks."""
        return Moments(self.n * factor, self.mean, self.m2 * factor)

    @classmethod
    def from_json(cls, data: list[float]) -> Moments:
        """A saved ``[n, mean, m2]`` (checked: :data:`MOMENTS`)."""
        return cls(*map(float, data))


@dataclass
class PriorStats:
    """Running statistics of one scope (all prompts, or one cluster label)."""

    rewards: Moments = field(default_factory=Moments)  # every reward: mu_glob, total sigma^2
    group_means: Moments = field(default_factory=Moments)  # one value per prompt: tau^2, BB pass-rate moments
    within_var: Moments = field(default_factory=Moments)  # unbiased within-group variance, groups with G >= 2
    inv_group_size: Moments = field(default_factory=Moments)  # 1 / G per prompt, for the debiased tau^2

    _PARTS = ("rewards", "group_means", "within_var", "inv_group_size")

    def scaled(self, factor: float) -> PriorStats:
        return PriorStats(*(getattr(self, p).scaled(factor) for p in self._PARTS))

    def table(self) -> list[list[float]]:
        """[[n, mean, m2] per part] (the layout of the batch tables of :func:`_segment_tables`)."""
        return [getattr(self, p).row() for p in self._PARTS]

    def to_json(self) -> dict[str, list[float]]:
        return dict(zip(self._PARTS, self.table(), strict=True))

    @classmethod
    def from_table(cls, table: list[list[float]]) -> PriorStats:
        return cls(*(Moments(*part) for part in table))

    @classmethod
    def from_json(cls, data: Mapping[str, list[float]]) -> PriorStats:
        """A saved ``{part: [n, mean, m2]}`` (checked: :data:`STATS`)."""
        return cls(*(Moments.from_json(data[p]) for p in cls._PARTS))


STATS = Record(dict.fromkeys(PriorStats._PARTS, MOMENTS))
"""The saved form of :class:`PriorStats`."""


@dataclass
class EBPOState(FreshState):
    """Running EB statistics of one training run (the diagnostics of a call are in its result)."""

    steps: int = 0
    prompts_seen: int = 0
    responses_seen: int = 0
    global_stats: PriorStats = field(default_factory=PriorStats)
    clusters: dict[str, PriorStats] = field(default_factory=dict)
    FIELDS: ClassVar[Record] = Record(
        {**dict.fromkeys(COUNTS, COUNT), "global": STATS, "clusters": Table(STATS)}, version=STATE_VERSION
    )
    """The saved form, field by field (:mod:`ebpo_verl.algos.state_codec`)."""

    def state_dict(self) -> dict[str, Any]:
        clusters = {label: stats.to_json() for label, stats in self.clusters.items()}
        counts = {key: getattr(self, key) for key in COUNTS}
        return {"version": STATE_VERSION, **counts, "global": self.global_stats.to_json(), "clusters": clusters}

    def load_state_dict(self, state: Any, options: Mapping[str, Any] | None = None) -> None:
        """Restore a :meth:`state_dict` checked by :data:`FIELDS` (nothing changes when a field is refused)."""
        decode(self.FIELDS, state, "EBPO state:", options)
        self.steps, self.prompts_seen, self.responses_seen = (state[key] for key in COUNTS)
        self.global_stats = PriorStats.from_json(state["global"])
        self.clusters = {label: PriorStats.from_json(stats) for label, stats in state["clusters"].items()}
