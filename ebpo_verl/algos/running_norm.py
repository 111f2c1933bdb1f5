"""Running reward normalisation: cumulative reward moments, globally or per data domain (torch / numpy, no verl
import).

As ROLL's ``RunningMoments`` (``alibaba/ROLL``, ``roll/utils/functionals.py``): one accumulator per domain (or one
for the whole run), no decay, merged with each batch by the parallel (Chan et al.) update; each step updates with
the current batch first, then A = (r - mean) / (std + 1e-6), std the Bessel-corrected standard deviation of every
reward the domain's accumulator has seen (0 while it holds one reward). The domain of a row is
``extra_info[row_key]`` (e.g. a topic or the data source); ``row_key=null`` is one global accumulator. We key the
accumulators by the domain's value (ROLL's ``reward_norm`` appears to look one up under a literal key: not copied).
Padding rows get 0 and enter no accumulator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from ebpo_verl.algos.estimator import Advantages, Batch, FreshState
from ebpo_verl.algos.grouping import scatter_rows, sorted_sum
from ebpo_verl.algos.moments import MOMENTS, Moments
from ebpo_verl.algos.registry import EstimatorSpec, StateSpec
from ebpo_verl.algos.state_codec import COUNT, Record, Table, decode, saturated
from ebpo_verl.options.parsing import OptionSection, nullable, option, reals, resume_option, text

STATE_VERSION = 1
GLOBAL = "(all)"
"""The accumulator's name with ``row_key=null``."""


@dataclass(frozen=True)
class RunningNormOptions(OptionSection):
    """Options of the ``running_norm`` estimator (``algorithm.running_norm.<key>``); defaults = ROLL's."""

    SECTION: ClassVar[str] = "algorithm.running_norm"

    row_key: str | None = nullable(
        "the extra_info field naming each row's domain (e.g. topic, data_source), one accumulator per value; "
        "null: one global accumulator. A field needs ebpo-train (stock main_ppo passes no per-row fields)",
        text("an extra_info field name"),
    )
    epsilon: float = option(
        1e-6, "added to the running std in the division (ROLL: 1e-6)", rule=reals(0.0, open_low=True)
    )
    on_resume_mismatch: str = resume_option(
        "a resume whose options differ from the checkpoint's: error, reset or keep (never for a changed row_key), "
        "as algorithm.spo.on_resume_mismatch"
    )


@dataclass
class RunningNormState(FreshState):
    """The accumulators of one run: domain -> reward moments (count, mean, M2), and the number of calls."""

    steps: int = 0
    domains: dict[str, Moments] = field(default_factory=dict)
    FIELDS: ClassVar[Record] = Record({"steps": COUNT, "domains": Table(MOMENTS)}, version=STATE_VERSION)
    """The saved form, field by field (:mod:`ebpo_verl.algos.state_codec`)."""

    def state_dict(self) -> dict[str, Any]:
        domains = {name: m.row() for name, m in sorted(self.domains.items())}
        return {"version": STATE_VERSION, "steps": self.steps, "domains": domains}

    def load_state_dict(self, state: Any, options: Mapping[str, Any] | None = None) -> None:
        """Restore a :meth:`state_dict` checked by :data:`FIELDS`; a refused field leaves this state unchanged."""
        decode(self.FIELDS, state, "running_norm state:", options)
        self.steps = state["steps"]
        self.domains = {name: Moments.from_json(value) for name, value in state["domains"].items()}


def compute_running_norm_advantages(batch: Batch, options: RunningNormOptions, state: RunningNormState) -> Advantages:
    """A = (r - mean_d) / (std_d + eps) with each domain d's running moments after merging this batch, shape
    ``(bs,)``; padding rows get 0. Updates ``state`` (the accumulators) in place; diagnostics ``running_norm/*``.
    The rows are grouped by domain: ``row_values`` (compared as strings; required with ``row_key``), or
    :data:`GLOBAL` for every row without ``row_key``."""
    if options.row_key is None:
        g = batch.key_groups(np.full(batch.scores.shape[0], GLOBAL, dtype=object), "domain(s)")
    elif batch.row_values is None:
        raise ValueError(
            f"adv_estimator=running_norm with algorithm.running_norm.row_key={options.row_key!r} needs "
            "each row's extra_info field, which stock main_ppo does not pass: train with ebpo-train, or set "
            "algorithm.running_norm.row_key=null for one global accumulator"
        )
    else:
        g = batch.key_groups(batch.row_values, f"domain(s) (extra_info[{options.row_key!r}])")
    if len(g.keys) == 0:
        return Advantages(scatter_rows(batch.scores, g, g.r), {})
    names, size = g.keys.tolist(), g.size.numpy()
    past = Moments.stack([state.domains.get(name, Moments()) for name in names])
    merged = past.merged(Moments(size, g.mean.numpy(), g.var.numpy() * (size - 1.0))).unstack()
    state.domains.update(zip(names, merged, strict=True))
    state.steps = saturated(state.steps)
    mean = torch.tensor([m.mean for m in merged], dtype=torch.float64)
    std = torch.tensor([(m.m2 / (m.n - 1.0)) ** 0.5 if m.n > 1.0 else 0.0 for m in merged], dtype=torch.float64)
    adv = (g.r - mean.index_select(0, g.row_group)) / (std.index_select(0, g.row_group) + float(options.epsilon))
    diagnostics = {
        "running_norm/mean": (sorted_sum(mean) / len(mean)).item(),
        "running_norm/std": (sorted_sum(std) / len(std)).item(),
        "running_norm/domains": float(len(state.domains)),
    }
    return Advantages(scatter_rows(batch.scores, g, adv), diagnostics)


SPECS = (
    EstimatorSpec(
        "running_norm",
        "running reward normalisation: cumulative reward moments, globally or per extra_info domain, no decay",
        "ROLL (alibaba/ROLL) roll/utils/functionals.py RunningMoments",
        compute=compute_running_norm_advantages, options_cls=RunningNormOptions,
        state=StateSpec(RunningNormState, "running_norm_state.json", "running_norm", "running reward moments (empty)",
                        never_keep=("row_key",)),
        row_input="row_key",
    ),
)  # fmt: skip
