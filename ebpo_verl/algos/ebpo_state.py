"""The ``ebpo`` estimator's running statistics (Welford / Chan moments per scope) and their saved form."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ebpo_verl.options.parsing import is_real

STATE_VERSION = 1


def _finite_float(x: Any, what: str, minimum: float | None = None) -> float:
    if not is_real(x) or (minimum is not None and x < minimum):
        bound = "" if minimum is None else f" >= {minimum:g}"
        raise ValueError(f"{what} must be a finite number{bound}, got {x!r:.60}")
    return float(x)


def _count(x: Any, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {x!r:.60}")
    return x


@dataclass
class Moments:
    """Weighted count, mean and sum of squared deviations (M2); merged with Chan et al.'s parallel formula."""

    n: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def merge(self, other: Moments) -> Moments:
        n = self.n + other.n
        if n == 0.0:
            return Moments()
        delta = other.mean - self.mean
        mean = self.mean + delta * other.n / n
        m2 = self.m2 + other.m2 + delta * delta * self.n * other.n / n
        return Moments(n, mean, m2)

    def scaled(self, factor: float) -> Moments:
        """Down-weight (exponential forgetting): the mean and variance are unchanged, the weight shrinks."""
        return Moments(self.n * factor, self.mean, self.m2 * factor)

    @property
    def variance(self) -> float:
        """Population variance M2 / n (0 when empty)."""
        return self.m2 / self.n if self.n > 0 else 0.0

    def is_finite(self) -> bool:
        return math.isfinite(self.n) and math.isfinite(self.mean) and math.isfinite(self.m2)

    @classmethod
    def from_json(cls, data: Any, what: str) -> Moments:
        """``[n, mean, m2]`` with n, m2 >= 0 and all three finite."""
        if not isinstance(data, (list, tuple)) or len(data) != 3:
            raise ValueError(f"{what} must be a list [n, mean, m2], got {data!r:.60}")
        n = _finite_float(data[0], f"{what} count", 0.0)
        return cls(n, _finite_float(data[1], f"{what} mean"), _finite_float(data[2], f"{what} m2", 0.0))


@dataclass
class PriorStats:
    """Running statistics of one scope (all prompts, or one cluster label)."""

    rewards: Moments = field(default_factory=Moments)  # every reward: mu_glob, total sigma^2
    group_means: Moments = field(default_factory=Moments)  # one value per prompt: tau^2, BB pass-rate moments
    within_var: Moments = field(default_factory=Moments)  # unbiased within-group variance, groups with G >= 2
    inv_group_size: Moments = field(default_factory=Moments)  # 1 / G per prompt, for the debiased tau^2

    _PARTS = ("rewards", "group_means", "within_var", "inv_group_size")

    def merge(self, other: PriorStats) -> PriorStats:
        return PriorStats(*(getattr(self, p).merge(getattr(other, p)) for p in self._PARTS))

    def scaled(self, factor: float) -> PriorStats:
        return PriorStats(*(getattr(self, p).scaled(factor) for p in self._PARTS))

    @property
    def prompts(self) -> float:
        return self.group_means.n

    def is_finite(self) -> bool:
        return all(getattr(self, p).is_finite() for p in self._PARTS)

    def to_json(self) -> dict[str, list[float]]:
        return {p: [getattr(self, p).n, getattr(self, p).mean, getattr(self, p).m2] for p in self._PARTS}

    def table(self) -> list[list[float]]:
        """[[n, mean, m2] per part] (the layout of the batch tables of :func:`_segment_tables`)."""
        return [[m.n, m.mean, m.m2] for m in (self.rewards, self.group_means, self.within_var, self.inv_group_size)]

    @classmethod
    def from_table(cls, table: list[list[float]]) -> PriorStats:
        return cls(*(Moments(*part) for part in table))

    @classmethod
    def from_json(cls, data: Any, what: str = "statistics") -> PriorStats:
        if not isinstance(data, Mapping) or set(data) != set(cls._PARTS):
            got = sorted(map(str, data))[:8] if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(f"EBPO state: {what} need exactly the parts {cls._PARTS}, got {got}")
        return cls(*(Moments.from_json(data[p], f"EBPO state: {what}.{p}") for p in cls._PARTS))


@dataclass
class EBPOState:
    """Running EB statistics of one training run (the diagnostics of a call are in its result)."""

    steps: int = 0
    prompts_seen: int = 0
    responses_seen: int = 0
    global_stats: PriorStats = field(default_factory=PriorStats)
    clusters: dict[str, PriorStats] = field(default_factory=dict)

    def reset(self) -> None:
        self.__init__()

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable, versioned snapshot (floats round-trip exactly through ``json``)."""
        return {
            "version": STATE_VERSION,
            "steps": self.steps,
            "prompts_seen": self.prompts_seen,
            "responses_seen": self.responses_seen,
            "global": self.global_stats.to_json(),
            "clusters": {label: stats.to_json() for label, stats in self.clusters.items()},
        }

    def load_state_dict(self, state: Any) -> None:
        """Restore a :meth:`state_dict`; every field is validated (counts >= 0, finite values, list lengths)
        and nothing changes when one is wrong (ValueError naming the field)."""
        if not isinstance(state, Mapping):
            raise ValueError(f"EBPO state must be a JSON object, got {type(state).__name__}")
        version = state.get("version")
        if version != STATE_VERSION:
            raise ValueError(f"EBPO state version {version!r:.60} is not supported (expected {STATE_VERSION})")
        missing = {"steps", "prompts_seen", "responses_seen", "global", "clusters"} - set(state)
        if missing:
            raise ValueError(f"EBPO state is missing key(s) {sorted(missing)}")
        counts = [_count(state[k], f"EBPO state: {k}") for k in ("steps", "prompts_seen", "responses_seen")]
        global_stats = PriorStats.from_json(state["global"], "global")
        clusters = state["clusters"]
        if not isinstance(clusters, Mapping):
            raise ValueError(f"EBPO state: clusters must be an object (label -> statistics), got {clusters!r:.60}")
        loaded = {}
        for label, stats in clusters.items():
            if not isinstance(label, str):
                raise ValueError(f"EBPO state: cluster label {label!r:.60} is not a string")
            loaded[label] = PriorStats.from_json(stats, f"clusters[{label!r}]")
        self.steps, self.prompts_seen, self.responses_seen = counts
        self.global_stats = global_stats
        self.clusters = loaded
