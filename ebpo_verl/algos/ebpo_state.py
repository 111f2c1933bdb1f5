"""The ``ebpo`` estimator's running statistics (Welford / Chan moments per scope) and their saved form."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ebpo_verl.algos.estimator import FreshState
from ebpo_verl.algos.moments import MOMENTS, Moments
from ebpo_verl.algos.state_codec import COUNT, Record, Table, decode

STATE_VERSION = 1
COUNTS = ("steps", "prompts_seen", "responses_seen")


@dataclass
class PriorStats:
    """Statistics of one scope (all prompts, or one cluster label), or of several (:class:`Moments` of arrays)."""

    rewards: Moments = field(default_factory=Moments)  # every reward: mu_glob, total sigma^2
    group_means: Moments = field(default_factory=Moments)  # one value per prompt: tau^2, BB pass-rate moments
    within_var: Moments = field(default_factory=Moments)  # unbiased within-group variance, groups with G >= 2
    inv_group_size: Moments = field(default_factory=Moments)  # 1 / G per prompt, for the debiased tau^2

    _PARTS = ("rewards", "group_means", "within_var", "inv_group_size")

    def parts(self) -> list[Moments]:
        return [getattr(self, p) for p in self._PARTS]

    def scaled(self, factor: float) -> PriorStats:
        return PriorStats(*(m.scaled(factor) for m in self.parts()))

    def merged(self, other: PriorStats) -> PriorStats:
        return PriorStats(*(a.merged(b) for a, b in zip(self.parts(), other.parts(), strict=True)))

    def finite(self) -> bool:
        return all(m.finite() for m in self.parts())

    @classmethod
    def stack(cls, scopes: Sequence[PriorStats]) -> PriorStats:
        """Several scopes' float statistics as one of arrays (one element per scope)."""
        return cls(*(Moments.stack([getattr(s, p) for s in scopes]) for p in cls._PARTS))

    def unstack(self) -> list[PriorStats]:
        """Each scope's float statistics (:meth:`stack` reversed)."""
        return [PriorStats(*parts) for parts in zip(*(m.unstack() for m in self.parts()), strict=True)]

    def to_json(self) -> dict[str, list[float]]:
        return {p: m.row() for p, m in zip(self._PARTS, self.parts(), strict=True)}

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
