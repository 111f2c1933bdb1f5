"""JSPO's history variant: the James-Stein weight and the batch mean smoothed across steps (torch / numpy, no verl
import).

In the JSPO authors' code only (``jspo_plus_plus`` in ``guanning03/JSPO-Official``; not in arXiv 2511.03710).
Per step t, over the whole batch: v_t = mean_k s_k^2 / G_k (s_k^2 the unbiased variance of prompt k's rewards),
s_t = mean_k (mu_k - rbar_t)^2 with rbar_t the batch's mean reward, lam_t = v_t / (v_t + s_t + 1e-6). With the
smoothing coefficient c both series are replaced by a time-weighted moving average: w = min(sqrt(c), 0.999),
a_1 = 1, a_t = w^(1642.65 / (t - 1)) for t >= 2, N_t = a_t N_{t-1} + y_t, D_t = a_t D_{t-1} + 1, estimate
N_t / D_t (c = 0: the step's own values). Baseline b_ij = (1 - lam) L_ij + lam rbar with the smoothed lam and
rbar and L_ij the leave-one-out mean of response j's group; A_ij = r_ij - b_ij, not normalised.

The state (t, D, and N of lam and of rbar) is saved with every checkpoint (the authors keep it in module globals,
lost on a restart). Every prompt needs G >= 2 responses (as the authors' code); padding rows get 0 and enter no
statistic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from ebpo_verl.algos.estimator import Advantages, Batch, FreshState
from ebpo_verl.algos.grouping import scatter_rows, sorted_sum
from ebpo_verl.algos.registry import EstimatorSpec, StateSpec, always
from ebpo_verl.algos.state_codec import COUNT, MEAN, WEIGHT, Record, decode, saturated
from ebpo_verl.options.parsing import OptionSection, option, reals, resume_option

EPS = 1e-6
HORIZON = 1642.65
"""The authors' constant in a_t = w^(HORIZON / (t - 1))."""
MAX_DECAY_BASE = 0.999
STATE_VERSION = 1


@dataclass(frozen=True)
class JSPOHistoryOptions(OptionSection):
    """Options of the ``jspo_history`` estimator (``algorithm.jspo_history.<key>``)."""

    SECTION: ClassVar[str] = "algorithm.jspo_history"

    smoothing: float = option(
        0.99,
        "c: the time-weighted moving average's coefficient, w = min(sqrt(c), 0.999); 0: no smoothing. 0.99 as the "
        "authors' math script (their config's default is 0)",
        rule=reals(0.0, 1.0, open_high=True),
    )
    on_resume_mismatch: str = resume_option(
        "a resume whose options differ from the checkpoint's: error, reset or keep, as algorithm.spo.on_resume_mismatch"
    )


@dataclass
class JSPOHistoryState(FreshState):
    """The smoothed series of one run: steps t, the weight D_t and the weighted sums N_t of lam and rbar."""

    steps: int = 0
    weight: float = 0.0
    lam_sum: float = 0.0
    mean_sum: float = 0.0
    FIELDS: ClassVar[Record] = Record(
        {"steps": COUNT, "weight": WEIGHT, "lam_sum": WEIGHT, "mean_sum": MEAN}, version=STATE_VERSION
    )
    """The saved form, field by field (:mod:`ebpo_verl.algos.state_codec`): D_t and the sum of the lambdas (rates)
    grow by at most 1 a step, the sum of the batch means is a discounted sum of means."""

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, **asdict(self)}

    def load_state_dict(self, state: Any, options: Mapping[str, Any] | None = None) -> None:
        """Restore a :meth:`state_dict` checked by :data:`FIELDS`; a refused field leaves this state unchanged."""
        decode(self.FIELDS, state, "jspo_history state:", options)
        self.steps = state["steps"]
        self.weight, self.lam_sum, self.mean_sum = (float(state[k]) for k in ("weight", "lam_sum", "mean_sum"))


def decay(step: int, smoothing: float) -> float:
    """a_t of step ``step`` (1-based): 1 at the first step, else min(sqrt(c), 0.999)^(1642.65 / (t - 1))."""
    if step <= 1:
        return 1.0
    return min(math.sqrt(smoothing), MAX_DECAY_BASE) ** (HORIZON / (step - 1))


def compute_jspo_history_advantages(batch: Batch, options: JSPOHistoryOptions, state: JSPOHistoryState) -> Advantages:
    """A_ij = r_ij - [(1 - lam) L_ij + lam rbar] with lam and rbar smoothed over the steps (module doc), shape
    ``(bs,)``, the rows grouped by uid (``row_values`` not read); padding rows get 0. Updates ``state`` (the
    smoothed series) in place; diagnostics ``jspo_history/*``."""
    g = batch.uid_groups()
    if len(g.keys) == 0:
        return Advantages(scatter_rows(batch.scores, g, g.r), {})
    if bool((g.size < 2).any()):
        lone = g.keys[(g.size < 2).numpy()].tolist()
        raise ValueError(
            f"jspo_history needs at least 2 responses per prompt (a leave-one-out mean; the authors' code requires "
            f"G >= 2); uid(s) {lone[:20]} have one: set actor_rollout_ref.rollout.n >= 2"
        )
    n = len(g.keys)
    rbar_t = sorted_sum(g.r).item() / len(g.r)
    v_t = sorted_sum(g.var / g.size).item() / n
    s_t = sorted_sum((g.mean - rbar_t) ** 2).item() / n
    lam_t = v_t / (v_t + s_t + EPS)
    a = decay(state.steps + 1, float(options.smoothing))
    state.weight = a * state.weight + 1.0
    state.lam_sum = a * state.lam_sum + lam_t
    state.mean_sum = a * state.mean_sum + rbar_t
    state.steps = saturated(state.steps)
    lam, rbar = state.lam_sum / state.weight, state.mean_sum / state.weight
    m_row = g.size.index_select(0, g.row_group)
    loo = (m_row * g.mean.index_select(0, g.row_group) - g.r) / (m_row - 1)
    adv = g.r - ((1.0 - lam) * loo + lam * rbar)
    diagnostics = {
        "jspo_history/lambda": lam,
        "jspo_history/lambda_step": lam_t,
        "jspo_history/mean": rbar,
        "jspo_history/mean_step": rbar_t,
        "jspo_history/decay": a,
    }
    return Advantages(scatter_rows(batch.scores, g, adv), diagnostics)


SPECS = (
    EstimatorSpec(
        "jspo_history", "JSPO's history variant: the James-Stein weight and batch mean smoothed across steps",
        "JSPO authors' code guanning03/JSPO-Official (jspo_plus_plus; not in arXiv 2511.03710)",
        compute=compute_jspo_history_advantages, options_cls=JSPOHistoryOptions,
        state=StateSpec(JSPOHistoryState, "jspo_history_state.json", "jspo_history",
                        "smoothed James-Stein weight and batch mean"),
        min_group=always("a leave-one-out mean needs G >= 2"),
    ),
)  # fmt: skip
