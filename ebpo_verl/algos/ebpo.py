"""EBPO advantage math: Empirical-Bayes shrinkage of the GRPO baseline (numpy/torch only, no verl import).

Han et al., "EBPO: Empirical Bayes Shrinkage for Stabilizing Group-Relative Policy Optimization",
arXiv 2602.05165. For a prompt q with G_q responses and rewards r_i:

    mu_q = mean_i r_i                                    (group mean)
    S_q  = (sigma^2 / G_q) / (sigma^2 / G_q + tau^2 + eps)  (shrinkage toward the prior)
    V_q  = (1 - S_q) mu_q + S_q mu_glob                   (EB baseline)
    A_i  = r_i - V_q, then standardised over the batch    (norm="batch")

mu_glob, sigma^2 and tau^2 are running statistics over the training history (Welford / Chan merges,
optionally with exponential forgetting), or over the current batch only (``stats_scope="batch"``: the
authors' released code exactly, see :func:`compute_ebpo_advantages`). ``prior="beta_binomial"`` is EBPO-BB
from the v2 draft: a Beta(alpha, beta) prior fitted by the method of moments on earlier batches' pass rates,
baseline = posterior mean (alpha + s_q) / (alpha + beta + G_q), i.e. the same form with S_q = nu / (nu + G_q),
mu_glob = alpha / nu.

The per-call work runs on the host in float64 numpy over one vector of scores (one device-to-host copy); the
uids and labels are factorised once with pandas' hash tables. Every sum runs over values in sorted order, so
results and state are bit-identical under any row order and any uid strings (a resumed run sees fresh uids).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch

from ebpo_verl.options.parsing import OptionSection, ints, is_real, option, reals, text

STATE_VERSION = 1
RESUME_CHOICES = ("error", "reset", "keep")


@dataclass(frozen=True)
class EBPOOptions(OptionSection):
    """Options of the ``ebpo`` estimator (``algorithm.ebpo.<key>`` in verl); defaults = the arXiv algorithm box."""

    SECTION: ClassVar[str] = "algorithm.ebpo"

    prior: str = option(
        "gaussian",
        "gaussian | beta_binomial (EBPO-BB of the v2 draft; needs a two-level reward, 0/1 or -1/+1; with "
        "stats_scope=history always fitted on earlier batches only, Beta(1,1) warm-up; with stats_scope=batch "
        "fitted on the current batch)",
        choices=("gaussian", "beta_binomial"),
    )
    stats_scope: str = option(
        "history",
        "history (Welford statistics persist across steps) | batch (the authors' released code exactly: current "
        "batch only, mu_glob = mean of the group means, no eps in the shrinkage denominator and S = 1 where it is "
        "<= epsilon, norm=none still subtracts the batch mean)",
        choices=("history", "batch"),
    )
    sigma2: str = option(
        "total",
        "total (population variance of all rewards seen) | within (running mean of per-prompt unbiased "
        "within-group variances; groups of one contribute nothing)",
        choices=("total", "within"),
    )
    tau2: str = option(
        "raw",
        "raw (population variance of the group means seen) | debiased (raw minus the expected sampling noise "
        "sigma^2 * mean(1/G), floored at 0)",
        choices=("raw", "debiased"),
    )
    merge: str = option(
        "before",
        "before (merge the batch into the statistics, then compute its advantages) | after (use only earlier "
        "batches; on the first step, with no history, the current batch)",
        choices=("before", "after"),
    )
    norm: str = option(
        "batch",
        "batch ((A - mean_batch A) / (std_batch A + eps), unbiased std) | group (A / (sqrt((1-S) s_q^2 + S sigma^2) "
        "+ eps); at S=0 this is verl's grpo for groups of two or more: a group of one gets 0, where grpo returns "
        "its raw reward) | none",
        choices=("batch", "group", "none"),
    )
    shrinkage: str | float = option(
        "auto",
        "auto (S from the formula) or a fixed float in [0, 1] (0: group-mean baseline, 1: global mean)",
        choices=("auto",),
        rule=reals(0.0, 1.0),
    )
    decay: float = option(
        1.0,
        "1.0 keeps all history; a value in (0, 1) down-weights the history by that factor every step",
        rule=reals(0.0, 1.0, open_low=True),
    )
    cluster_key: str | None = option(
        None,
        "name of a per-prompt label (e.g. topic); one set of statistics per label, blended toward the global prior "
        "with weight min(1, prompts_in_label / min_cluster_prompts)",
        choices=(None,),
        rule=text("a label name"),
    )
    min_cluster_prompts: int = option(64, "prompts a label needs before its own prior is used unblended", rule=ints(0))
    epsilon: float = option(
        1e-6,
        "the eps of the shrinkage and normalisation formulas (with stats_scope=batch: the threshold below which "
        "S = 1, and the normalisation eps, both 1e-6 in the released code)",
        rule=reals(0.0, open_low=True),
    )
    on_resume_mismatch: str = option(
        "error",
        "what a resume does when these options differ from the checkpoint's: error (stop before the first "
        "rollout), reset (fresh statistics, with a warning), keep (continue with the saved statistics); not "
        "itself compared",
        choices=RESUME_CHOICES,
    )

    @property
    def fixed_shrinkage(self) -> float | None:
        return None if self.shrinkage == "auto" else float(self.shrinkage)


OPTION_KEYS: tuple[str, ...] = EBPOOptions.keys()


RESUME_KEYS: tuple[str, ...] = tuple(k for k in OPTION_KEYS if k != "on_resume_mismatch")
"""The options a resume compares with the checkpoint's (all but ``on_resume_mismatch`` itself)."""


def ignored_keys(options: EBPOOptions) -> set[str]:
    """The options the mode of ``options`` never reads (whatever their values)."""
    ignored: set[str] = set()
    if options.stats_scope == "batch":
        ignored |= {"merge", "decay"}
    if options.prior == "beta_binomial":
        ignored |= {"sigma2", "tau2", "merge"}
    elif options.fixed_shrinkage is not None:
        ignored |= {"tau2"} | ({"sigma2"} if options.norm != "group" else set())
    if options.cluster_key is None:
        ignored.add("min_cluster_prompts")
    return ignored


def ignored_options(options: EBPOOptions) -> list[str]:
    """``key=value`` of each option set away from its default that the chosen mode never reads."""
    ignored = ignored_keys(options)
    defaults = EBPOOptions()
    return [
        f"{k}={getattr(options, k)!r}"
        for k in OPTION_KEYS
        if k in ignored and getattr(options, k) != getattr(defaults, k)
    ]


def ignored_options_warning(options: EBPOOptions) -> str | None:
    """One line naming the options set away from their defaults that the chosen mode ignores (None: none)."""
    ignored = ignored_options(options)
    if not ignored:
        return None
    mode = (
        f"stats_scope={options.stats_scope}, prior={options.prior}, shrinkage={options.shrinkage}, "
        f"norm={options.norm}, cluster_key={options.cluster_key or 'null'}"
    )
    return f"algorithm.ebpo option(s) {', '.join(ignored)} have no effect with {mode}"


def _finite_float(x: Any, what: str, minimum: float | None = None) -> float:
    if not is_real(x) or (minimum is not None and x < minimum):
        bound = "" if minimum is None else f" >= {minimum:g}"
        raise ValueError(f"{what} must be a finite number{bound}, got {x!r}")
    return float(x)


def _count(x: Any, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {x!r}")
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
            raise ValueError(f"{what} must be a list [n, mean, m2], got {data!r}")
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
            got = sorted(data) if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(f"EBPO state: {what} need exactly the parts {cls._PARTS}, got {got}")
        return cls(*(Moments.from_json(data[p], f"EBPO state: {what}.{p}") for p in cls._PARTS))


@dataclass
class EBPOState:
    """Running EB statistics of one training run, plus the diagnostics of the last call."""

    steps: int = 0
    prompts_seen: int = 0
    responses_seen: int = 0
    global_stats: PriorStats = field(default_factory=PriorStats)
    clusters: dict[str, PriorStats] = field(default_factory=dict)
    diagnostics: dict[str, float] = field(default_factory=dict)

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
            raise ValueError(f"EBPO state version {version!r} is not supported (expected {STATE_VERSION})")
        missing = {"steps", "prompts_seen", "responses_seen", "global", "clusters"} - set(state)
        if missing:
            raise ValueError(f"EBPO state is missing key(s) {sorted(missing)}")
        counts = [_count(state[k], f"EBPO state: {k}") for k in ("steps", "prompts_seen", "responses_seen")]
        global_stats = PriorStats.from_json(state["global"], "global")
        clusters = state["clusters"]
        if not isinstance(clusters, Mapping):
            raise ValueError(f"EBPO state: clusters must be an object (label -> statistics), got {clusters!r}")
        loaded = {}
        for label, stats in clusters.items():
            if not isinstance(label, str):
                raise ValueError(f"EBPO state: cluster label {label!r} is not a string")
            loaded[label] = PriorStats.from_json(stats, f"clusters[{label!r}]")
        self.steps, self.prompts_seen, self.responses_seen = counts
        self.global_stats = global_stats
        self.clusters = loaded
        self.diagnostics = {}


GLOBAL_STATE = EBPOState()


@dataclass
class _Priors:
    """Priors of several scopes: mean, reward variance sigma^2, between-prompt variance tau^2, BB strength nu."""

    mu: np.ndarray
    sigma2: np.ndarray
    tau2: np.ndarray
    nu: np.ndarray


def _variance(moments: np.ndarray) -> np.ndarray:
    """Population variance M2 / n of (..., 3) tables of (n, mean, M2); 0 where empty."""
    return np.divide(moments[..., 2], moments[..., 0], out=np.zeros(moments.shape[:-1]), where=moments[..., 0] > 0)


def _gaussian_priors(table: np.ndarray, opts: EBPOOptions) -> _Priors:
    """Gaussian priors of the scopes of an (S, 4, 3) statistics table."""
    # the released code (batch scope) takes mu_glob as the mean of the group means (prompt-weighted)
    mu = table[:, 1, 1] if opts.stats_scope == "batch" else table[:, 0, 1]
    sigma2 = _variance(table[:, 0]) if opts.sigma2 == "total" else table[:, 2, 1]
    tau2 = _variance(table[:, 1])
    if opts.tau2 == "debiased":
        tau2 = np.maximum(tau2 - sigma2 * table[:, 3, 1], 0.0)
    return _Priors(mu, sigma2, tau2, np.full(len(table), np.nan))


def _beta_fit(p: np.ndarray, v: np.ndarray, empty: np.ndarray, eps: float) -> _Priors:
    """Method of moments on pass rates (mean p, variance v): nu = p(1-p)/v - 1; weak nu = 2 outside the valid
    range; Beta(1,1) where empty."""
    p, v = np.where(empty, 0.5, p), np.where(empty, 1.0 / 12.0, v)
    q = p * (1.0 - p)
    valid = ~empty & (eps < v) & (v < q - eps)
    return _Priors(p, q, v, np.where(valid, q / np.where(valid, v, 1.0) - 1.0, 2.0))


def _beta_priors(table: np.ndarray, opts: EBPOOptions) -> _Priors:
    """Beta priors of the scopes of an (S, 4, 3) statistics table, fitted on their pass rates."""
    return _beta_fit(table[:, 1, 1], _variance(table[:, 1]), table[:, 1, 0] == 0.0, opts.epsilon)


def _cluster_priors(priors: _Priors, prompts: np.ndarray, opts: EBPOOptions) -> _Priors:
    """Each cluster's prior (``priors`` rows 1..) blended toward the global one (row 0) with weight 0 without
    history, prompts / min_cluster_prompts, 1 from min_cluster_prompts on; a BB blend is refitted by moments."""
    mcp = opts.min_cluster_prompts
    weight = np.where(prompts == 0.0, 0.0, 1.0 if mcp == 0 else np.minimum(1.0, prompts / max(mcp, 1)))

    def mix(values: np.ndarray) -> np.ndarray:
        return weight * values[1:] + (1.0 - weight) * values[0]

    if opts.prior == "beta_binomial":
        return _beta_fit(mix(priors.mu), mix(priors.tau2), np.zeros(len(prompts), dtype=bool), opts.epsilon)
    return _Priors(mix(priors.mu), mix(priors.sigma2), mix(priors.tau2), np.full(len(prompts), np.nan))


def _moments(values: np.ndarray, seg: np.ndarray, weight: np.ndarray | None, n_seg: int) -> np.ndarray:
    """(n_seg, 3) table of (n, mean, M2) per segment, two-pass; ``values`` come in value order, so each segment's
    sums run in value order (independent of the row order and of the uid strings)."""
    n = np.bincount(seg, weights=weight, minlength=n_seg).astype(np.float64, copy=False)
    total = np.bincount(seg, weights=values if weight is None else values * weight, minlength=n_seg)
    mean = np.divide(total, n, out=np.zeros(n_seg), where=n > 0)
    dev = values - mean[seg]
    sq = dev * dev if weight is None else dev * dev * weight
    return np.stack([n, mean, np.bincount(seg, weights=sq, minlength=n_seg)], axis=1)


def _segment_tables(
    x_sorted: np.ndarray,
    group_of_sorted: np.ndarray,
    group_size: np.ndarray,
    group_mean: np.ndarray,
    group_var: np.ndarray,
    segmentations: list[tuple[np.ndarray, int]],
) -> list[np.ndarray]:
    """Batch statistics of each segmentation (``(segment of each group, number of segments)``: all prompts, the
    clusters) as an (n_seg, 4, 3) table: (n, mean, M2) of the rewards, the group means, the within-group
    variances (groups of two or more) and 1 / G. The rewards come sorted; the three per-group series are sorted
    once, side by side, and share one bincount per segmentation (each series offset by n_seg)."""
    series = np.stack([group_mean, group_var, 1.0 / group_size])
    weights = np.stack([np.ones_like(group_size), (group_size >= 2).astype(np.float64), np.ones_like(group_size)])
    order = np.argsort(series, axis=1)
    series, weights = np.take_along_axis(series, order, 1).ravel(), np.take_along_axis(weights, order, 1).ravel()
    tables = []
    for group_seg, n_seg in segmentations:
        rows = _moments(x_sorted, group_seg[group_of_sorted], None, n_seg)
        seg = (group_seg[order] + np.arange(3)[:, None] * n_seg).ravel()
        groups = _moments(series, seg, weights, 3 * n_seg).reshape(3, n_seg, 3)
        tables.append(np.concatenate([rows[None], groups]).transpose(1, 0, 2))
    return tables


def _merge_tables(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:meth:`Moments.merge` (Chan et al.) on (..., 3) tables of (n, mean, M2), elementwise."""
    a_n, a_mean, a_m2 = a[..., 0], a[..., 1], a[..., 2]
    b_n, b_mean, b_m2 = b[..., 0], b[..., 1], b[..., 2]
    n = a_n + b_n
    some = n > 0
    safe = np.where(some, n, 1.0)
    delta = b_mean - a_mean
    mean = np.where(some, a_mean + delta * b_n / safe, 0.0)
    m2 = np.where(some, a_m2 + b_m2 + delta * delta * a_n * b_n / safe, 0.0)
    return np.stack([np.where(some, n, 0.0), mean, m2], axis=-1)


def _sorted_mean(values: np.ndarray) -> float:
    """Mean summed in value order (independent of the order of the rows)."""
    return float(np.sort(values).sum() / values.size)


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


def padding_names(names: np.ndarray, prefix: str) -> np.ndarray | None:
    """Per distinct uid: does it start with ``prefix`` (verl's ``pad`` rows)? None when none does (one cheap
    substring test over the few distinct names; no per-row string work)."""
    if "\0" + prefix not in "\0" + "\0".join(names.tolist()):
        return None
    return np.strings.startswith(names.astype(str), prefix)


def _score_vector(scores: torch.Tensor) -> torch.Tensor:
    scores = torch.as_tensor(scores)
    if scores.dim() != 1:
        raise ValueError(
            f"scores must have shape (bs,), one per response; got shape {tuple(scores.shape)} (sum token-level "
            "rewards over the response first)"
        )
    if scores.is_complex():
        raise ValueError(f"scores must be real numbers, got dtype {scores.dtype}")
    return scores


def _to_host(scores: torch.Tensor, valid: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Scores (float64) and the valid flags on the host, in one device-to-host copy."""
    if scores.device.type == "cpu" and valid.device.type == "cpu":
        return scores.detach().to(torch.float64).numpy(), valid.detach().numpy().astype(bool, copy=False)
    if valid.device == scores.device:
        both = torch.stack([scores.detach().to(torch.float64), valid.detach().to(torch.float64)]).cpu().numpy()
        return both[0], both[1] != 0
    return scores.detach().to(torch.float64).cpu().numpy(), valid.detach().cpu().numpy().astype(bool)


def _two_levels(r: np.ndarray, row_uids: Callable[[np.ndarray], list[str]]) -> tuple[float, float]:
    """(lowest level, span) of a two-level reward: 0/1 -> (0, 1), the paper's -1/+1 -> (-1, 2); else ValueError."""
    zero_one = (r == 0.0) | (r == 1.0)
    if zero_one.all():
        return 0.0, 1.0
    plus_minus = (r == -1.0) | (r == 1.0)
    if plus_minus.all():
        return -1.0, 2.0
    bad = ~zero_one & ~plus_minus
    bad = bad if bad.any() else r == 0.0  # only -1, 0 and 1: three levels
    values = np.unique(r)
    offenders = row_uids(bad)
    raise ValueError(
        f"prior=beta_binomial needs a two-level reward (0/1, or the paper's -1/+1), but this batch has reward "
        f"values {values[:8].tolist()}{' ...' if len(values) > 8 else ''} (uid(s) {offenders[:20]}). Other values "
        "come from a shaped reward: algorithm.use_kl_in_reward=True subtracts a KL penalty, an overlong/format "
        "penalty or partial credit adds levels. Use prior=gaussian, or a plain two-level reward."
    )


def compute_ebpo_advantages(
    scores: torch.Tensor,
    index: Sequence[Any] | np.ndarray,
    valid: torch.Tensor,
    options: EBPOOptions,
    state: EBPOState,
    labels: Sequence[Any] | np.ndarray | None = None,
    pad_prefix: str | None = None,
) -> torch.Tensor:
    """Per-response EBPO advantages (shape ``(bs,)``, on the device of ``scores``); padding rows get 0.

    Args:
        scores: response rewards, shape (bs,), any real dtype (the result is floating: the dtype of ``scores``
            when it is floating, else torch's default dtype).
        index: per-response prompt uids (compared as strings).
        valid: False for padding rows; they get advantage 0 and never touch the statistics.
        options: estimator options.
        state: running statistics, updated in place (unless ``stats_scope="batch"``); left unchanged on error.
        labels: per-response cluster labels (compared as strings; None/NaN = missing), required iff
            ``options.cluster_key``.
        pad_prefix: rows whose uid starts with it are padding too (verl's ``pad`` rows).

    ``stats_scope="batch"`` is the released code (docs/paper_notes.md#released-code): sigma^2 = population variance
    of the batch's rewards, tau^2 = population variance of its group means, mu_glob = mean of the group means,
    S = (sigma^2/G_q) / (sigma^2/G_q + tau^2) where that denominator exceeds eps else 1, then
    (A - mean A) / (std A + eps) (unbiased std), or only A - mean A with ``norm="none"``.
    With ``prior="beta_binomial"`` and -1/+1 rewards the posterior mean p_q of the pass rate is an expected
    reward of 2 p_q - 1: the statistics are kept in pass units and advantages mapped back to reward units.
    """
    scores = _score_vector(scores)
    bs = scores.shape[0]
    out_dtype = scores.dtype if scores.is_floating_point() else torch.get_default_dtype()
    uid_arr = np.asarray(index, dtype=object)
    valid = torch.as_tensor(valid)
    if uid_arr.shape != (bs,) or tuple(valid.shape) != (bs,):
        raise ValueError(f"index {uid_arr.shape} and valid {tuple(valid.shape)} must have shape ({bs},)")
    r_all, valid_np = _to_host(scores, valid)
    uid_codes, uid_names = factorize_keys(uid_arr)
    if pad_prefix is not None:
        is_pad = padding_names(uid_names, pad_prefix)
        if is_pad is not None:
            valid_np = valid_np & ~is_pad[uid_codes]
    every_row = bool(valid_np.all())
    rows = np.arange(bs) if every_row else np.flatnonzero(valid_np)
    r = r_all if every_row else r_all[rows]
    codes = uid_codes if every_row else uid_codes[rows]

    def row_uids(mask: np.ndarray) -> list[str]:
        """Sorted distinct uids of the (valid) rows selected by ``mask``, for error messages."""
        return sorted(set(uid_names[codes[mask]].tolist()))

    bad = ~np.isfinite(r)
    if bad.any():
        offenders = row_uids(bad)
        raise ValueError(f"non-finite (NaN/inf) rewards for uid(s) {offenders[:20]}: check the reward function")
    lo, span = _two_levels(r, row_uids) if options.prior == "beta_binomial" else (0.0, 1.0)

    if rows.size == 0:
        state.diagnostics = {}
        return torch.zeros(bs, dtype=out_dtype, device=scores.device)

    if every_row:  # factorize's codes are already 0..n-1
        row_group, n_groups = codes, len(uid_names)
    else:
        used = np.bincount(codes, minlength=len(uid_names)) > 0
        row_group, n_groups = (np.cumsum(used) - 1)[codes], int(used.sum())
    x = r if span == 1.0 and lo == 0.0 else (r - lo) / span  # BB: pass indicator 0/1
    # Group moments, summed in value order: independent of the row order and of the (fresh per run) uid strings.
    order = np.argsort(x, kind="stable")
    x_sorted, group_of_sorted = x[order], row_group[order]
    g = np.bincount(group_of_sorted, minlength=n_groups).astype(np.float64)
    mu_q = np.bincount(group_of_sorted, weights=x_sorted, minlength=n_groups) / g
    dev = x_sorted - mu_q[group_of_sorted]
    m2_q = np.bincount(group_of_sorted, weights=dev * dev, minlength=n_groups)
    var_q = np.where(g >= 2, m2_q / np.maximum(g - 1.0, 1.0), 0.0)
    r_max = np.full(n_groups, -np.inf)
    np.maximum.at(r_max, row_group, r)
    r_min = np.full(n_groups, np.inf)
    np.minimum.at(r_min, row_group, r)

    cluster_names, group_cluster = _group_clusters(row_uids, rows, bs, row_group, n_groups, labels, options)
    zeros_seg = np.zeros(n_groups, dtype=np.int64)
    segmentations = [(zeros_seg, 1)] + ([(group_cluster, len(cluster_names))] if cluster_names is not None else [])
    batch = np.concatenate(_segment_tables(x_sorted, group_of_sorted, g, mu_q, var_q, segmentations))
    stored, prior_table = _next_statistics(state, batch, cluster_names, options)

    scopes = (_beta_priors if options.prior == "beta_binomial" else _gaussian_priors)(prior_table, options)
    if cluster_names is None:
        priors, group_prior = scopes, zeros_seg
    else:
        priors, group_prior = _cluster_priors(scopes, prior_table[1:, 1, 0], options), group_cluster

    prior_mu = priors.mu[group_prior]
    prior_sigma2 = priors.sigma2[group_prior]
    eps = options.epsilon
    if options.fixed_shrinkage is not None:
        shrink = np.full(n_groups, options.fixed_shrinkage)
    elif options.prior == "beta_binomial":
        nu = priors.nu[group_prior]
        shrink = nu / (nu + g)
    else:
        noise = prior_sigma2 / g
        denom = noise + priors.tau2[group_prior]
        if options.stats_scope == "batch":  # released code: no eps, S = 1 where the denominator is <= 1e-6
            big = denom > eps
            shrink = np.where(big, noise / np.where(big, denom, 1.0), 1.0)
        else:
            shrink = noise / (denom + eps)

    baseline = (1.0 - shrink) * mu_q + shrink * prior_mu
    adv = span * (x - baseline[row_group])  # BB with -1/+1: reward minus the expected reward 2 p_q - 1
    if options.norm == "batch":
        ordered = np.sort(adv)
        mean = ordered.sum() / ordered.size
        var = ((ordered - mean) ** 2).sum() / (ordered.size - 1) if ordered.size >= 2 else 0.0
        adv = (adv - mean) / (math.sqrt(var) + eps)
    elif options.norm == "group":
        scale = span * np.sqrt((1.0 - shrink) * var_q + shrink * prior_sigma2)
        adv = adv / (scale[row_group] + eps)
    elif options.stats_scope == "batch":  # released code with norm_adv_by_std_in_grpo=False: A - mean(A)
        adv = adv - _sorted_mean(adv)

    if not (np.isfinite(adv).all() and np.isfinite(batch).all() and (stored is None or stored[2])):
        raise _overflow_error(state.steps + 1, r, row_uids)
    if out_dtype != torch.float64 and adv.size and np.abs(adv).max() > torch.finfo(out_dtype).max:
        raise _overflow_error(state.steps + 1, r, row_uids, f"advantages above the {out_dtype} maximum")
    _commit(state, batch[0], stored)
    state.diagnostics = _diagnostics(
        state, scopes, shrink, r_min, r_max, cluster_names, priors, group_cluster, lo, span
    )

    if rows.size == bs:
        full = adv
    else:
        full = np.zeros(bs)
        full[rows] = adv
    return torch.from_numpy(full).to(device=scores.device, dtype=out_dtype)


def _overflow_error(
    call: int, r: np.ndarray, row_uids: Callable[[np.ndarray], list[str]], what: str = "non-finite"
) -> ValueError:
    """The statistics or advantages left the float range: name the estimator call (``state.steps + 1``: one per
    training step since the statistics began, so verl's global step in a run that was never reset) and the uids
    with the largest rewards."""
    mag = np.abs(r)
    offenders = row_uids(mag >= 0.01 * mag.max())
    return ValueError(
        f"EBPO estimator call {call} (one per training step since the statistics began): the statistics or "
        f"advantages overflow ({what}) with rewards as large as {mag.max():.3g}; "
        f"largest rewards in uid(s) {offenders[:20]}. Scale the reward down; the running state was left unchanged."
    )


def _group_clusters(
    row_uids: Callable[[np.ndarray], list[str]],
    rows: np.ndarray,
    bs: int,
    row_group: np.ndarray,
    n_groups: int,
    labels: Sequence[Any] | np.ndarray | None,
    options: EBPOOptions,
) -> tuple[list[str] | None, np.ndarray]:
    """Cluster id per group from per-row labels; every row of a group must carry the same label."""
    if options.cluster_key is None:
        return None, np.zeros(n_groups, dtype=np.int64)
    if labels is None:
        raise ValueError(
            f"algorithm.ebpo.cluster_key={options.cluster_key!r} needs per-row labels; run training through "
            "`python -m ebpo_verl.main` (it passes extra_info[cluster_key]) or unset cluster_key"
        )
    label_arr = np.asarray(labels, dtype=object)
    if label_arr.shape != (bs,):
        raise ValueError(f"labels have shape {label_arr.shape}, expected ({bs},) (one per response)")
    row_cluster, names = factorize_keys(label_arr[rows], missing=True)
    missing = row_cluster < 0
    if missing.any():
        offenders = row_uids(missing)
        raise ValueError(f"no {options.cluster_key!r} label (None/NaN) for uid(s) {offenders[:20]}")
    group_cluster = np.full(n_groups, -1, dtype=np.int64)
    group_cluster[row_group] = row_cluster
    inconsistent = group_cluster[row_group] != row_cluster
    if inconsistent.any():
        offenders = row_uids(inconsistent)
        raise ValueError(f"uid(s) {offenders[:20]} carry more than one {options.cluster_key!r} label")
    return names.tolist(), group_cluster


def _next_statistics(
    state: EBPOState, batch: np.ndarray, cluster_names: list[str] | None, options: EBPOOptions
) -> tuple[tuple[PriorStats, dict[str, PriorStats], bool] | None, np.ndarray]:
    """(the statistics to store after this batch and whether they are all finite, or None in batch scope;
    the (1 + clusters, 4, 3) table the priors are built from). ``batch``: the batch's tables, global first.

    ``state`` is not changed: the caller commits once everything is known to be finite.
    """
    names = cluster_names or []
    if options.stats_scope == "batch":
        return None, batch
    decay = float(options.decay)
    empty = PriorStats()
    past = np.array([state.global_stats.table()] + [state.clusters.get(n, empty).table() for n in names])
    if decay != 1.0:
        past[..., 0] *= decay
        past[..., 2] *= decay
    new = _merge_tables(past, batch)
    new_scopes = [PriorStats.from_table(t) for t in new.tolist()]
    stored = {k: v.scaled(decay) for k, v in state.clusters.items()} if decay != 1.0 else dict(state.clusters)
    stored.update(zip(names, new_scopes[1:], strict=True))
    result = (new_scopes[0], stored, bool(np.isfinite(new).all()))
    if options.prior == "beta_binomial" or (options.merge == "after" and past[0, 1, 0] > 0):
        # A cluster without history falls back to the global prior through its blending weight of 0.
        return result, past
    return result, new


def _commit(
    state: EBPOState, batch_global: np.ndarray, stored: tuple[PriorStats, dict[str, PriorStats], bool] | None
) -> None:
    state.steps += 1
    state.prompts_seen += int(batch_global[1, 0])
    state.responses_seen += int(batch_global[0, 0])
    if stored is not None:
        state.global_stats, state.clusters, _ = stored


def _diagnostics(
    state: EBPOState,
    scopes: _Priors,
    shrink: np.ndarray,
    r_min: np.ndarray,
    r_max: np.ndarray,
    cluster_names: list[str] | None,
    priors: _Priors,
    group_cluster: np.ndarray,
    lo: float,
    span: float,
) -> dict[str, float]:
    """``ebpo/*`` metrics; prior moments in reward units (a -1/+1 BB reward: mu = 2 p - 1, variances x 4)."""
    diag = {
        "ebpo/shrinkage_mean": _sorted_mean(shrink),
        "ebpo/shrinkage_min": float(shrink.min()),
        "ebpo/shrinkage_max": float(shrink.max()),
        "ebpo/mu_glob": float(lo + span * scopes.mu[0]),
        "ebpo/sigma2": float(span * span * scopes.sigma2[0]),
        "ebpo/tau2": float(span * span * scopes.tau2[0]),
        "ebpo/prompts_seen": float(state.prompts_seen),
        "ebpo/responses_seen": float(state.responses_seen),
        "ebpo/frac_zero_var_groups": float(np.count_nonzero(r_max == r_min) / r_max.size),
        "ebpo/frac_all_fail": float(np.count_nonzero(r_max <= 0) / r_max.size),
        "ebpo/frac_all_pass": float(np.count_nonzero(r_min >= 1) / r_min.size),
    }
    if cluster_names:
        order = np.argsort(shrink)
        seg = group_cluster[order]
        means = np.bincount(seg, weights=shrink[order], minlength=len(cluster_names)) / np.bincount(seg)
        for cid, name in enumerate(cluster_names):
            diag[f"ebpo/cluster/{name}/mu_glob"] = float(lo + span * priors.mu[cid])
            diag[f"ebpo/cluster/{name}/shrinkage_mean"] = float(means[cid])
    return diag
