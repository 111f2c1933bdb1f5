"""HA-DW: history-aware adaptive difficulty weighting of GRPO's advantage (torch / numpy, no verl import).

"History-Aware Adaptive Difficulty Weighting", arXiv 2601.08521 (v2), Sec. 3. One global anchor C, the belief
about the policy's current success rate, re-weights GRPO's advantage by each prompt's difficulty relative to it:
with x the rewards as pass rates, mu_i prompt i's mean pass rate and C_prior the anchor after the last step,
diff_i = mu_i - C_prior, A_hat_ij = (r_ij - mean_i r) / (std_i r + eps) (GRPO; unbiased std),
D_ij = -sign(A_hat_ij) sign(diff_i), Phi_ij = lam_scale exp(D_ij |diff_i|) and A_ij = A_hat_ij Phi_ij: on hard
prompts (mu_i < C) right answers weigh more and wrong ones less, the reverse on easy ones. Phi > 0 per row, so the
clipped surrogate scales by it and it acts on the advantage alone. ``lam_scale`` (1.3, the paper's best of
0.5 / 1.0 / 1.3 / 1.5 / 2.0) also rescales every advantage. All-correct and all-wrong groups stay 0 (A_hat = 0).

Anchor update after the step, y_t the batch's mean pass rate: ``adaptive`` (the paper's main rule)
C_post = (1 - eta_t) C_prior + eta_t y_t with eta_t = eta sigma_t, sigma_t the population std of the last
``window`` posterior anchors; ``hard`` C_post = ((h - 1) / h) C_prior + y_t / h.

Our choices (the paper leaves them unstated; all are options): eta = 1 with eta_t clipped to [0, 1] (an anchor in
[0, 1] has sigma <= 0.5, so eta_t <= 0.5); window m = 8; h = 10; the initial anchor C0 = the first batch's mean
pass rate (``anchor_init=null``; it is step 1's C_prior only); the warm-up: with identical buffered anchors
sigma = 0 and the adaptive anchor would never move, so for the first m steps the anchor is the running mean of
y_1..y_t (C_post = ((t - 1) / t) C_prior + y_t / t), after which the buffer holds m distinct values; the std
epsilon is verl GRPO's 1e-6; a lone response gets A_hat = 0 (verl's GRPO gives it r).

Rewards: the anchor is a success rate, so rewards in [0, 1] are pass rates as they are and the paper's -1/+1
reward is mapped to (r + 1) / 2 (as ``bnpo``); other rewards are refused. Padding rows get 0 and enter nothing.
The state (anchor, buffer, steps) is saved with every checkpoint.

``form=authors_code`` is the authors' code instead (``yangfengkai/HA-DW``, ``verl/trainer/ppo/core_algos.py``,
``compute_ha_dw_outcome_advantage``), not the paper's anchor recursion: a window of the last 10 batch-mean rewards,
the current batch's included, mu_hist its mean; with mu_g the group's mean reward,
A_ij = 1.5 exp(-sign(mu_g - mu_hist) sign(r_ij - mu_g) |mu_g - mu_hist|) (r_ij - mu_g) / (std_g + epsilon)
(unbiased std). Raw rewards (no pass-rate mapping or refusal); ``lam_scale``, ``update`` and the anchor options
are not read; a lone response gets mu_g = 0 and std_g = 1 as in that code (and verl's GRPO), so A = 1.5 e^.. r.
Their ``hist_var`` is unused and omitted; their window is not checkpointed, ours is (``batch_means`` in the state).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ebpo_verl.algos.estimator import Advantages, Batch, FreshState
from ebpo_verl.algos.grouping import Groups, pass_levels, scatter_rows, sorted_sum
from ebpo_verl.algos.registry import EstimatorSpec, StateSpec
from ebpo_verl.algos.state_codec import COUNT, MEAN, RATE, Record, Seq, decode, saturated
from ebpo_verl.algos.state_codec import nullable as or_null
from ebpo_verl.options.parsing import OptionSection, ints, nullable, option, reals, resume_option

UPDATES = ("adaptive", "hard")
FORMS = ("paper", "authors_code")
STATE_VERSION = 1
AUTHORS_WINDOW = 10
"""authors_code: batch-mean rewards kept (the authors' k)."""
AUTHORS_SCALE = 1.5
"""authors_code: the fixed scale of their weight."""


@dataclass(frozen=True)
class HADWOptions(OptionSection):
    """Options of the ``ha_dw`` estimator (``algorithm.ha_dw.<key>``); constants the paper leaves unstated are
    ours (module doc)."""

    SECTION: ClassVar[str] = "algorithm.ha_dw"

    form: str = option(
        "paper",
        "paper: arXiv 2601.08521's anchor recursion (the other options); authors_code: yangfengkai/HA-DW's weight "
        "1.5 exp(-sign(mu_g - mu_hist) sign(r - mu_g) |mu_g - mu_hist|), mu_hist the mean of the last 10 batch means",
        choices=FORMS,
    )
    lam_scale: float = option(
        1.3,
        "Phi's scale (paper: 1.3 best of 0.5-2.0; it rescales every advantage; at most 100)",
        rule=reals(0.0, 100.0, open_low=True),
    )
    update: str = option(
        "adaptive", "the anchor update: adaptive (eta_t = eta * std of the last window anchors) or hard (1/h)",
        choices=UPDATES,
    )  # fmt: skip
    eta: float = option(1.0, "adaptive: eta_t = min(1, eta * sigma_t) (ours; unstated)", rule=reals(0.0))
    window: int = option(
        8,
        "adaptive: anchors in the std buffer, and warm-up steps of running mean (ours; unstated)",
        rule=ints(2, 2**53),
    )
    hard_horizon: int = option(10, "hard: h in C = ((h-1)/h) C + y/h (ours; unstated)", rule=ints(1, 2**53))
    anchor_init: float | None = nullable(
        "C0, step 1's anchor; null: the first batch's mean pass rate (ours; unstated)", reals(0.0, 1.0)
    )
    epsilon: float = option(1e-6, "GRPO's std epsilon (verl's 1e-6)", rule=reals(0.0, open_low=True))
    on_resume_mismatch: str = resume_option(
        "a resume whose options differ from the checkpoint's: error, reset or keep, as algorithm.spo.on_resume_mismatch"
    )


@dataclass
class HADWState(FreshState):
    """The anchor of one run (None before the first step), the buffer of its last posterior values, the steps;
    ``form=authors_code``: ``batch_means``, the last batch-mean rewards (empty under ``paper``)."""

    steps: int = 0
    anchor: float | None = None
    history: list[float] = field(default_factory=list)
    batch_means: list[float] = field(default_factory=list)
    FIELDS: ClassVar[Record] = Record(
        {
            "steps": COUNT,
            "anchor": or_null(RATE),
            "history": Seq(RATE, longest="window"),
            "batch_means": Seq(MEAN, longest=AUTHORS_WINDOW, shortest=1),
        },
        optional=("batch_means",),
        version=STATE_VERSION,
    )
    """The saved form, field by field (:mod:`ebpo_verl.algos.state_codec`): the anchors are success rates."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable, versioned snapshot (floats round-trip exactly through ``json``); ``batch_means`` only when
        non-empty, so a ``paper`` form's snapshot is what it was before ``authors_code`` existed."""
        out = {"version": STATE_VERSION, "steps": self.steps, "anchor": self.anchor, "history": list(self.history)}
        return {**out, "batch_means": list(self.batch_means)} if self.batch_means else out

    def load_state_dict(self, state: Any, options: Mapping[str, Any] | None = None) -> None:
        """Restore a :meth:`state_dict` checked by :data:`FIELDS` (``history`` at most ``window`` long under the
        ``options`` it was written with; one without ``batch_means``, as every older one, has none); a refused field
        leaves this state unchanged."""
        decode(self.FIELDS, state, "ha_dw state:", options)
        anchor = state["anchor"]
        self.steps, self.anchor = state["steps"], None if anchor is None else float(anchor)
        self.history = [float(v) for v in state["history"]]
        self.batch_means = [float(v) for v in state.get("batch_means", [])]


HA_DW_REFUSAL = (
    "ha_dw's anchor is a success rate: it needs rewards in [0, 1] or the paper's -1/+1, but uid(s) {keys} have "
    "rewards {values}; use REWARD=math or REWARD=paper without shaping"
)


def next_anchor(prior: float, y: float, step: int, history: list[float], options: HADWOptions) -> tuple[float, float]:
    """(C_post, eta_t) after step ``step`` (1-based) with batch pass rate ``y``; ``history`` holds the last
    ``window`` posterior anchors before this step (module doc: warm-up, adaptive, hard)."""
    if options.update == "hard":
        eta_t = 1.0 / options.hard_horizon
    elif step <= options.window or not history:  # warm-up (or a saved state without anchors): running mean
        eta_t = 1.0 / step
    else:
        mean = sum(history) / len(history)
        sigma = math.sqrt(sum((c - mean) ** 2 for c in history) / len(history))
        eta_t = min(1.0, float(options.eta) * sigma)
    return (1.0 - eta_t) * prior + eta_t * y, eta_t


def authors_code_advantages(g: Groups, epsilon: float, state: HADWState) -> tuple[torch.Tensor, dict[str, float]]:
    """``form=authors_code`` (module doc): the valid rows' advantages and diagnostics; the current batch's mean
    reward enters ``state.batch_means`` first, then mu_hist is the window's mean."""
    state.batch_means = [*state.batch_means, sorted_sum(g.r).item() / len(g.r)][-AUTHORS_WINDOW:]
    state.steps = saturated(state.steps)
    mu_hist = sum(state.batch_means) / len(state.batch_means)
    lone = g.size == 1
    mu = torch.where(lone, torch.zeros_like(g.mean), g.mean).index_select(0, g.row_group)
    std = torch.where(lone, torch.ones_like(g.var), g.var.sqrt()).index_select(0, g.row_group)
    diff = mu - mu_hist
    scale = AUTHORS_SCALE * torch.exp(-torch.sign(diff) * torch.sign(g.r - mu) * diff.abs())
    if not bool(torch.isfinite(scale).all()):
        raise ValueError(
            f"ha_dw form=authors_code: the weight exp(|mu_g - mu_hist|) overflows: a group's mean reward is "
            f"{diff.abs().max().item():.3g} from the window's mean {mu_hist:.3g}; scale the reward down or use "
            "form=paper"
        )
    diagnostics = {
        "ha_dw/history_mean": mu_hist,
        "ha_dw/batch_mean": state.batch_means[-1],
        "ha_dw/weight_mean": (sorted_sum(scale) / len(scale)).item(),
    }
    return scale * (g.r - mu) / (std + epsilon), diagnostics


def compute_ha_dw_advantages(batch: Batch, options: HADWOptions, state: HADWState) -> Advantages:
    """HA-DW advantages A_ij = A_hat_ij lam_scale exp(-sign(A_hat_ij) sign(diff_i) |diff_i|) (module doc), shape
    ``(bs,)``, the rows grouped by uid (``row_values`` not read); padding rows get 0. Then the anchor update;
    ``state`` (the anchor and its buffer) changes in place; diagnostics ``ha_dw/*``. ``form=authors_code``: the
    authors' weight and window of batch means instead (module doc)."""
    g = batch.uid_groups()
    if len(g.keys) == 0:
        return Advantages(scatter_rows(batch.scores, g, g.r), {})
    if options.form == "authors_code":
        adv, diagnostics = authors_code_advantages(g, float(options.epsilon), state)
        return Advantages(scatter_rows(batch.scores, g, adv), diagnostics)
    lo, span = pass_levels(g, HA_DW_REFUSAL)  # pass rates: [0, 1] as they are, -1/+1 -> (r + 1) / 2
    x = (g.r - lo) / span
    y = sorted_sum(x).item() / len(x)
    prior = next(c for c in (state.anchor, options.anchor_init, y) if c is not None)
    mu = torch.zeros(len(g.keys), dtype=torch.float64).index_add_(0, g.row_group, x) / g.size
    diff = mu - prior
    centred = g.r - g.mean.index_select(0, g.row_group)
    a_hat = centred / (g.var.sqrt().index_select(0, g.row_group) + float(options.epsilon))
    d = -torch.sign(a_hat) * torch.sign(diff).index_select(0, g.row_group)  # D_ij in {-1, 0, 1}
    phi = float(options.lam_scale) * torch.exp(d * diff.abs().index_select(0, g.row_group))
    step = state.steps + 1
    post, eta_t = next_anchor(float(prior), y, step, state.history, options)
    state.steps, state.anchor = saturated(state.steps), post
    state.history = [*state.history, post][-options.window :]
    diagnostics = {
        "ha_dw/anchor": float(prior),
        "ha_dw/anchor_next": post,
        "ha_dw/eta": eta_t,
        "ha_dw/pass_rate": y,
        "ha_dw/weight_mean": (sorted_sum(phi) / len(phi)).item(),
    }
    return Advantages(scatter_rows(batch.scores, g, a_hat * phi), diagnostics)


SPECS = (
    EstimatorSpec(
        "ha_dw", "history-aware difficulty weighting of GRPO's advantage by a global success-rate anchor",
        "arXiv 2601.08521 (HA-DW), Sec. 3; authors' code yangfengkai/HA-DW (form=authors_code)",
        compute=compute_ha_dw_advantages, options_cls=HADWOptions,
        state=StateSpec(HADWState, "ha_dw_state.json", "ha_dw",
                        "success-rate anchor (anchor_init, or the first batch's pass rate)"),
        pass_rates=lambda options: "its anchor is a success rate" if options.form == "paper" else None,
    ),
)  # fmt: skip
