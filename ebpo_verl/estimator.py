"""EBPO advantage math: Empirical-Bayes shrinkage of the GRPO baseline (torch only, no verl import).

Han et al., "EBPO: Empirical Bayes Shrinkage for Stabilizing Group-Relative Policy Optimization",
arXiv 2602.05165. For a prompt q with G_q responses and rewards r_i:

    mu_q = mean_i r_i                                    (group mean)
    S_q  = (sigma^2 / G_q) / (sigma^2 / G_q + tau^2 + eps)  (shrinkage toward the prior)
    V_q  = (1 - S_q) mu_q + S_q mu_glob                   (EB baseline)
    A_i  = r_i - V_q, then standardised over the batch    (norm="batch")

mu_glob, sigma^2 and tau^2 are running statistics over the training history (Welford / Chan merges,
optionally with exponential forgetting), or over the current batch only (``stats_scope="batch"``, what
the authors' released code does). ``prior="beta_binomial"`` is EBPO-BB from the v2 draft: a Beta(alpha,
beta) prior fitted by the method of moments on earlier batches' pass rates, baseline = posterior mean
(alpha + s_q) / (alpha + beta + G_q), i.e. the same form with S_q = nu / (nu + G_q), mu_glob = alpha / nu.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

# Gathers and scatters use index_select / index_add_ / index_copy_ rather than tensor[idx]: torch's advanced
# indexing takes a parallel path that costs milliseconds per call on a busy CPU (benchmarks/bench_advantage.py).

STATE_VERSION = 1
_CHOICES: dict[str, tuple[str, ...]] = {
    "prior": ("gaussian", "beta_binomial"),
    "stats_scope": ("history", "batch"),
    "sigma2": ("total", "within"),
    "tau2": ("raw", "debiased"),
    "merge": ("before", "after"),
    "norm": ("batch", "group", "none"),
}


@dataclass(frozen=True)
class EBPOOptions:
    """Options of the ``ebpo`` estimator (``algorithm.ebpo.<key>`` in verl); defaults = the arXiv algorithm box.

    prior: ``gaussian`` | ``beta_binomial`` (v2 draft; with ``stats_scope=history`` always fitted on earlier
        batches only, Beta(1,1) warm-up, so ``merge`` applies to the Gaussian prior; with ``stats_scope=batch``
        fitted on the current batch).
    stats_scope: ``history`` (Welford statistics persist across steps) | ``batch`` (current batch only: the
        authors' released code).
    sigma2: ``total`` (population variance of all rewards seen) | ``within`` (running mean of per-prompt
        unbiased within-group variances; groups of one contribute nothing).
    tau2: ``raw`` (population variance of the group means seen) | ``debiased`` (raw minus the expected sampling
        noise sigma^2 * mean(1/G), floored at 0).
    merge: ``before`` (merge the batch into the statistics, then compute its advantages) | ``after`` (use only
        earlier batches; on the first step, with no history, the current batch).
    norm: ``batch`` ((A - mean_batch A) / (std_batch A + eps), unbiased std) | ``group`` (A / (sqrt((1-S) s_q^2 +
        S sigma^2) + eps); at S=0 this is verl's ``grpo`` for groups of two or more: a group of one gets 0, where
        ``grpo`` returns its raw reward) | ``none``.
    shrinkage: ``auto`` (S from the formula) or a fixed float in [0, 1] (0: group-mean baseline, 1: global mean).
    decay: 1.0 keeps all history; a value in (0, 1) down-weights the history by that factor every step.
    cluster_key: name of a per-prompt label (e.g. ``topic``); one set of statistics per label, blended toward the
        global prior with weight min(1, prompts_in_label / min_cluster_prompts).
    min_cluster_prompts: prompts a label needs before its own prior is used unblended.
    epsilon: the eps of the shrinkage and normalisation formulas.
    """

    prior: str = "gaussian"
    stats_scope: str = "history"
    sigma2: str = "total"
    tau2: str = "raw"
    merge: str = "before"
    norm: str = "batch"
    shrinkage: str | float = "auto"
    decay: float = 1.0
    cluster_key: str | None = None
    min_cluster_prompts: int = 64
    epsilon: float = 1e-6

    def __post_init__(self) -> None:
        for key, choices in _CHOICES.items():
            if getattr(self, key) not in choices:
                raise ValueError(f"algorithm.ebpo.{key}={getattr(self, key)!r} is invalid; valid values: {choices}")
        s = self.shrinkage
        if s != "auto" and not (_is_real(s) and 0.0 <= float(s) <= 1.0):
            raise ValueError(f"algorithm.ebpo.shrinkage={s!r} is invalid; use 'auto' or a float in [0, 1]")
        if not (_is_real(self.decay) and 0.0 < float(self.decay) <= 1.0):
            raise ValueError(f"algorithm.ebpo.decay={self.decay!r} is invalid; use a float in (0, 1]")
        if self.cluster_key is not None and not (isinstance(self.cluster_key, str) and self.cluster_key):
            raise ValueError(f"algorithm.ebpo.cluster_key={self.cluster_key!r} is invalid; use null or a label name")
        mcp = self.min_cluster_prompts
        if isinstance(mcp, bool) or not isinstance(mcp, int) or mcp < 0:
            raise ValueError(f"algorithm.ebpo.min_cluster_prompts={mcp!r} is invalid; use an integer >= 0")
        if not (_is_real(self.epsilon) and float(self.epsilon) > 0.0):
            raise ValueError(f"algorithm.ebpo.epsilon={self.epsilon!r} is invalid; use a float > 0")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None) -> EBPOOptions:
        """Build options from ``config.ebpo`` (a dict or OmegaConf node; None -> defaults); unknown keys raise."""
        if mapping is None:
            return cls()
        values = dict(mapping.items())
        unknown = sorted(set(values) - set(OPTION_KEYS))
        if unknown:
            raise ValueError(f"unknown algorithm.ebpo option(s) {unknown}; valid keys: {list(OPTION_KEYS)}")
        return cls(**values)

    @property
    def fixed_shrinkage(self) -> float | None:
        return None if self.shrinkage == "auto" else float(self.shrinkage)


OPTION_KEYS: tuple[str, ...] = tuple(f.name for f in fields(EBPOOptions))


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


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

    def to_json(self) -> dict[str, list[float]]:
        return {p: [getattr(self, p).n, getattr(self, p).mean, getattr(self, p).m2] for p in self._PARTS}

    @classmethod
    def from_json(cls, data: Mapping[str, Sequence[float]]) -> PriorStats:
        if set(data) != set(cls._PARTS):
            raise ValueError(f"EBPO state: statistics need exactly the parts {cls._PARTS}, got {sorted(data)}")
        return cls(*(Moments(*map(float, data[p])) for p in cls._PARTS))


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

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        version = state.get("version")
        if version != STATE_VERSION:
            raise ValueError(f"EBPO state version {version!r} is not supported (expected {STATE_VERSION})")
        missing = {"steps", "prompts_seen", "responses_seen", "global", "clusters"} - set(state)
        if missing:
            raise ValueError(f"EBPO state is missing key(s) {sorted(missing)}")
        self.steps = int(state["steps"])
        self.prompts_seen = int(state["prompts_seen"])
        self.responses_seen = int(state["responses_seen"])
        self.global_stats = PriorStats.from_json(state["global"])
        self.clusters = {str(k): PriorStats.from_json(v) for k, v in state["clusters"].items()}
        self.diagnostics = {}


GLOBAL_STATE = EBPOState()


@dataclass
class _Prior:
    """Prior of one scope: mean, reward variance sigma^2, between-prompt variance tau^2, BB strength nu."""

    mu: float
    sigma2: float
    tau2: float
    nu: float = float("nan")


def _gaussian_prior(stats: PriorStats, opts: EBPOOptions) -> _Prior:
    mu = stats.rewards.mean
    sigma2 = stats.rewards.variance if opts.sigma2 == "total" else stats.within_var.mean
    tau2 = stats.group_means.variance
    if opts.tau2 == "debiased":
        tau2 = max(tau2 - sigma2 * stats.inv_group_size.mean, 0.0)
    return _Prior(mu, sigma2, tau2)


def _beta_prior(stats: PriorStats, opts: EBPOOptions) -> _Prior:
    """Method of moments on the pass rates: nu = p(1-p)/v - 1; weak nu = 2 outside the valid range; Beta(1,1) empty."""
    if stats.prompts == 0.0:
        p, v, nu = 0.5, 1.0 / 12.0, 2.0
    else:
        p, v = stats.group_means.mean, stats.group_means.variance
        eps = opts.epsilon
        nu = p * (1.0 - p) / v - 1.0 if eps < v < p * (1.0 - p) - eps else 2.0
    return _Prior(p, p * (1.0 - p), v, nu)


def _cluster_weight(prompts: float, min_prompts: int) -> float:
    """Weight of a label's own prior: 0 without history, prompts / min_prompts, 1 from min_prompts on."""
    if prompts == 0.0:
        return 0.0
    return 1.0 if min_prompts == 0 else min(1.0, prompts / min_prompts)


def _blend(local: _Prior, glob: _Prior, weight: float) -> _Prior:
    mix = lambda a, b: weight * a + (1.0 - weight) * b  # noqa: E731
    return _Prior(mix(local.mu, glob.mu), mix(local.sigma2, glob.sigma2), mix(local.tau2, glob.tau2))


def _segment_stats(
    rewards: torch.Tensor,
    row_group: torch.Tensor,
    group_size: torch.Tensor,
    group_mean: torch.Tensor,
    group_var: torch.Tensor,
    group_seg: torch.Tensor,
    n_seg: int,
) -> list[PriorStats]:
    """Batch statistics per segment (cluster), each computed two-pass in float64 with scatter ops."""

    def moments(values: torch.Tensor, seg: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        values, order = torch.sort(values, stable=True)  # sums in value order: independent of row/uid order
        seg, weight = seg.index_select(0, order), weight.index_select(0, order)
        n = torch.zeros(n_seg, dtype=torch.float64).index_add_(0, seg, weight)
        s = torch.zeros(n_seg, dtype=torch.float64).index_add_(0, seg, values * weight)
        mean = torch.where(n > 0, s / n.clamp_min(1e-300), torch.zeros_like(n))
        dev = values - mean.index_select(0, seg)
        m2 = torch.zeros(n_seg, dtype=torch.float64).index_add_(0, seg, dev * dev * weight)
        return torch.stack([n, mean, m2], dim=1)

    ones_rows = torch.ones_like(rewards)
    ones_groups = torch.ones_like(group_mean)
    parts = torch.stack(
        [
            moments(rewards, group_seg.index_select(0, row_group), ones_rows),
            moments(group_mean, group_seg, ones_groups),
            moments(group_var, group_seg, (group_size >= 2).to(torch.float64)),
            moments(1.0 / group_size, group_seg, ones_groups),
        ],
        dim=1,
    ).tolist()
    return [PriorStats(*(Moments(*part) for part in seg)) for seg in parts]


def _sorted_mean(values: torch.Tensor) -> float:
    """Mean summed in value order (independent of the order of the rows)."""
    return (torch.sort(values).values.sum() / values.numel()).item()


def _per_group(values: list[float], group_index: torch.Tensor) -> torch.Tensor:
    """Spread one value per prior (cluster) to its groups."""
    return torch.tensor(values, dtype=torch.float64).index_select(0, group_index)


def _factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    uniques, inverse = np.unique(values, return_inverse=True)
    return uniques, inverse.reshape(-1)


def compute_ebpo_advantages(
    scores: torch.Tensor,
    index: Sequence[Any] | np.ndarray,
    valid: torch.Tensor,
    options: EBPOOptions,
    state: EBPOState,
    labels: Sequence[Any] | np.ndarray | None = None,
) -> torch.Tensor:
    """Per-response EBPO advantages (shape ``(bs,)``, dtype of ``scores``); padding rows get 0.

    Args:
        scores: response rewards, shape (bs,).
        index: per-response prompt uids (compared as strings).
        valid: False for padding rows; they get advantage 0 and never touch the statistics.
        options: estimator options.
        state: running statistics, updated in place (unless ``stats_scope="batch"``).
        labels: per-response cluster labels (compared as strings), required iff ``options.cluster_key``.
    """
    bs = scores.shape[0]
    uids = np.asarray(index).astype(str)
    if uids.shape != (bs,) or valid.shape != (bs,):
        raise ValueError(f"index {uids.shape} and valid {tuple(valid.shape)} must have shape ({bs},)")
    valid_np = valid.detach().cpu().numpy().astype(bool)
    r_all = scores.detach().to(torch.float64).cpu()
    rows = torch.from_numpy(np.flatnonzero(valid_np))
    r = r_all.index_select(0, rows)

    bad = ~torch.isfinite(r)
    if bool(bad.any()):
        offenders = sorted(set(uids[rows[bad].numpy()].tolist()))
        raise ValueError(f"non-finite (NaN/inf) rewards for uid(s) {offenders[:20]}: check the reward function")
    if options.prior == "beta_binomial" and bool(((r < 0) | (r > 1)).any()):
        offenders = sorted(set(uids[rows[(r < 0) | (r > 1)].numpy()].tolist()))
        raise ValueError(
            f"prior=beta_binomial needs rewards in [0, 1]; uid(s) {offenders[:20]} have rewards outside it "
            "(use prior=gaussian for other reward scales)"
        )

    out = torch.zeros(bs, dtype=scores.dtype, device=scores.device)
    if rows.numel() == 0:
        state.diagnostics = {}
        return out

    group_uids, row_group_np = _factorize(uids[valid_np])
    row_group = torch.from_numpy(row_group_np)
    n_groups = len(group_uids)
    # Every sum runs over values in sorted order, so the result does not depend on the order of the rows or on
    # the uid strings (fresh per run): a resumed run reproduces the uninterrupted one bit for bit.
    r_sorted, by_value = torch.sort(r, stable=True)
    group_of_sorted = row_group.index_select(0, by_value)
    g = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_of_sorted, torch.ones_like(r))
    mu_q = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_of_sorted, r_sorted) / g
    dev = r_sorted - mu_q.index_select(0, group_of_sorted)
    m2_q = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_of_sorted, dev * dev)
    var_q = torch.where(g >= 2, m2_q / (g - 1).clamp_min(1.0), torch.zeros_like(m2_q))
    r_max = torch.full((n_groups,), -math.inf, dtype=torch.float64).scatter_reduce_(0, row_group, r, "amax")
    r_min = torch.full((n_groups,), math.inf, dtype=torch.float64).scatter_reduce_(0, row_group, r, "amin")

    cluster_names, group_cluster = _group_clusters(uids, valid_np, row_group_np, n_groups, labels, options)
    zeros_seg = torch.zeros(n_groups, dtype=torch.long)
    batch_global = _segment_stats(r, row_group, g, mu_q, var_q, zeros_seg, 1)[0]
    batch_clusters = (
        _segment_stats(r, row_group, g, mu_q, var_q, torch.from_numpy(group_cluster), len(cluster_names))
        if cluster_names is not None
        else []
    )

    prior_stats_global, prior_stats_clusters = _update_state(
        state, batch_global, cluster_names, batch_clusters, options
    )

    make_prior = _beta_prior if options.prior == "beta_binomial" else _gaussian_prior
    glob = make_prior(prior_stats_global, options)
    if cluster_names is None:
        priors = [glob]
        group_prior = zeros_seg
    else:
        priors = []
        for stats in prior_stats_clusters:
            weight = _cluster_weight(stats.prompts, options.min_cluster_prompts)
            local = make_prior(stats, options)
            blended = _blend(local, glob, weight)
            if options.prior == "beta_binomial":
                blended = _beta_prior(_moments_as_stats(blended.mu, blended.tau2), options)
            priors.append(blended)
        group_prior = torch.from_numpy(group_cluster)

    prior_mu = _per_group([p.mu for p in priors], group_prior)
    prior_sigma2 = _per_group([p.sigma2 for p in priors], group_prior)
    if options.fixed_shrinkage is not None:
        shrink = torch.full((n_groups,), options.fixed_shrinkage, dtype=torch.float64)
    elif options.prior == "beta_binomial":
        nu = _per_group([p.nu for p in priors], group_prior)
        shrink = nu / (nu + g)
    else:
        prior_tau2 = _per_group([p.tau2 for p in priors], group_prior)
        noise = prior_sigma2 / g
        shrink = noise / (noise + prior_tau2 + options.epsilon)

    baseline = (1.0 - shrink) * mu_q + shrink * prior_mu
    adv = r - baseline.index_select(0, row_group)
    eps = options.epsilon
    if options.norm == "batch":
        ordered = torch.sort(adv).values
        mean = ordered.sum() / ordered.numel()
        var = ((ordered - mean) ** 2).sum() / (ordered.numel() - 1) if ordered.numel() >= 2 else torch.zeros(())
        adv = (adv - mean) / (var.sqrt() + eps)
    elif options.norm == "group":
        scale = torch.sqrt((1.0 - shrink) * var_q + shrink * prior_sigma2)
        adv = adv / (scale.index_select(0, row_group) + eps)
    out.index_copy_(0, rows.to(out.device), adv.to(dtype=scores.dtype, device=scores.device))

    state.diagnostics = _diagnostics(state, glob, shrink, r_min, r_max, cluster_names, priors, group_cluster)
    return out


def _group_clusters(
    uids: np.ndarray,
    valid: np.ndarray,
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
    if label_arr.shape != uids.shape:
        raise ValueError(f"labels have shape {label_arr.shape}, expected {uids.shape} (one per response)")
    valid_labels = label_arr[valid]
    missing = np.equal(valid_labels, None)
    if missing.any():
        offenders = sorted(set(uids[valid][missing].tolist()))
        raise ValueError(f"no {options.cluster_key!r} label for uid(s) {offenders[:20]}")
    names, row_cluster = _factorize(valid_labels.astype(str))
    group_cluster = np.full(n_groups, -1, dtype=np.int64)
    group_cluster[row_group] = row_cluster
    inconsistent = group_cluster[row_group] != row_cluster
    if inconsistent.any():
        offenders = sorted(set(uids[valid][inconsistent].tolist()))
        raise ValueError(f"uid(s) {offenders[:20]} carry more than one {options.cluster_key!r} label")
    return names.tolist(), group_cluster


def _update_state(
    state: EBPOState,
    batch_global: PriorStats,
    cluster_names: list[str] | None,
    batch_clusters: list[PriorStats],
    options: EBPOOptions,
) -> tuple[PriorStats, list[PriorStats]]:
    """Merge the batch into the running statistics; return the statistics the prior is built from."""
    names = cluster_names or []
    state.steps += 1
    state.prompts_seen += int(batch_global.prompts)
    state.responses_seen += int(batch_global.rewards.n)
    if options.stats_scope == "batch":
        return batch_global, batch_clusters
    decay = float(options.decay)
    past_global = state.global_stats.scaled(decay)
    past_clusters = [state.clusters.get(n, PriorStats()).scaled(decay) for n in names]
    new_global = past_global.merge(batch_global)
    new_clusters = [p.merge(b) for p, b in zip(past_clusters, batch_clusters, strict=True)]
    if decay != 1.0:
        state.clusters = {k: v.scaled(decay) for k, v in state.clusters.items()}
    state.global_stats = new_global
    state.clusters.update(zip(names, new_clusters, strict=True))

    if options.prior == "beta_binomial":
        return past_global, past_clusters
    if options.merge == "after" and past_global.prompts > 0:
        # A cluster without history falls back to the global prior through its blending weight of 0.
        return past_global, past_clusters
    return new_global, new_clusters


def _moments_as_stats(mean: float, variance: float) -> PriorStats:
    """Pass-rate moments (mean, variance) as PriorStats, so a blended BB prior is refitted by moments."""
    return PriorStats(group_means=Moments(1.0, mean, variance))


def _diagnostics(
    state: EBPOState,
    glob: _Prior,
    shrink: torch.Tensor,
    r_min: torch.Tensor,
    r_max: torch.Tensor,
    cluster_names: list[str] | None,
    priors: list[_Prior],
    group_cluster: np.ndarray,
) -> dict[str, float]:
    diag = {
        "ebpo/shrinkage_mean": _sorted_mean(shrink),
        "ebpo/shrinkage_min": shrink.min().item(),
        "ebpo/shrinkage_max": shrink.max().item(),
        "ebpo/mu_glob": glob.mu,
        "ebpo/sigma2": glob.sigma2,
        "ebpo/tau2": glob.tau2,
        "ebpo/prompts_seen": float(state.prompts_seen),
        "ebpo/responses_seen": float(state.responses_seen),
        "ebpo/frac_zero_var_groups": _sorted_mean((r_max == r_min).double()),
        "ebpo/frac_all_fail": _sorted_mean((r_max <= 0).double()),
        "ebpo/frac_all_pass": _sorted_mean((r_min >= 1).double()),
    }
    for cid, name in enumerate(cluster_names or []):
        members = torch.from_numpy(np.flatnonzero(group_cluster == cid))
        diag[f"ebpo/cluster/{name}/mu_glob"] = priors[cid].mu
        diag[f"ebpo/cluster/{name}/shrinkage_mean"] = _sorted_mean(shrink.index_select(0, members))
    return diag
