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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from ebpo_verl.algos.ebpo import EBPOOptions, group_size_need, ignored_keys, ignored_options_warning
from ebpo_verl.algos.ebpo_state import EBPOState, PriorStats
from ebpo_verl.algos.estimator import Advantages, Batch
from ebpo_verl.algos.grouping import Groups, factorize_keys, pass_levels, scatter_rows, sorted_mean
from ebpo_verl.algos.moments import Moments
from ebpo_verl.algos.registry import EstimatorSpec, StateSpec
from ebpo_verl.algos.state_codec import saturated


@dataclass
class _Priors:
    """Priors of several scopes: mean, reward variance sigma^2, between-prompt variance tau^2, BB strength nu."""

    mu: np.ndarray
    sigma2: np.ndarray
    tau2: np.ndarray
    nu: np.ndarray


def _scope_priors(stats: PriorStats, opts: EBPOOptions) -> _Priors:
    """The priors of several scopes (arrays of :class:`PriorStats`): Beta fitted on the pass rates (EBPO-BB) or
    Gaussian."""
    rewards, group_means = stats.rewards, stats.group_means
    if opts.prior == "beta_binomial":
        return _beta_fit(group_means.mean, group_means.variance(), group_means.n == 0.0, opts.epsilon)
    # the released code (batch scope) takes mu_glob as the mean of the group means (prompt-weighted)
    mu = group_means.mean if opts.stats_scope == "batch" else rewards.mean
    sigma2 = rewards.variance() if opts.sigma2 == "total" else stats.within_var.mean
    tau2 = group_means.variance()
    if opts.tau2 == "debiased":
        tau2 = np.maximum(tau2 - sigma2 * stats.inv_group_size.mean, 0.0)
    return _Priors(mu, sigma2, tau2, np.full(len(mu), np.nan))


def _beta_fit(p: np.ndarray, v: np.ndarray, empty: np.ndarray, eps: float) -> _Priors:
    """Method of moments on pass rates (mean p, variance v): nu = p(1-p)/v - 1; weak nu = 2 outside the valid
    range; Beta(1,1) where empty."""
    p, v = np.where(empty, 0.5, p), np.where(empty, 1.0 / 12.0, v)
    q = p * (1.0 - p)
    valid = ~empty & (eps < v) & (v < q - eps)
    return _Priors(p, q, v, np.where(valid, q / np.where(valid, v, 1.0) - 1.0, 2.0))


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


def _batch_stats(groups: _GroupStats, group_cluster: np.ndarray, n_clusters: int | None) -> PriorStats:
    """This batch's statistics per scope: all prompts (scope 0), then each of ``n_clusters`` clusters (scope 1 +
    ``group_cluster``); a group counts in both. The moments of the rewards, the group means, the within-group
    variances (groups of two or more) and 1 / G, each series summed in value order."""
    scope_sets = [np.zeros_like(group_cluster)] + ([] if n_clusters is None else [1 + group_cluster])

    def per_scope(values: np.ndarray, group: np.ndarray, weight: np.ndarray | None = None) -> Moments:
        copies = len(scope_sets)
        scope = np.concatenate([s[group] for s in scope_sets])
        weights = None if weight is None else np.tile(weight, copies)
        return Moments.of_segments(np.tile(values, copies), scope, 1 + (n_clusters or 0), weights)

    def sorted_per_scope(values: np.ndarray, weight: np.ndarray | None = None) -> Moments:
        order = np.argsort(values)
        return per_scope(values[order], order, None if weight is None else weight[order])

    return PriorStats(
        rewards=per_scope(groups.x_sorted, groups.group_of_sorted),
        group_means=sorted_per_scope(groups.mu_q),
        within_var=sorted_per_scope(groups.var_q, (groups.g >= 2).astype(np.float64)),
        inv_group_size=sorted_per_scope(1.0 / groups.g),
    )


BB_REFUSAL = (
    "prior=beta_binomial needs a two-level reward (0/1, or the paper's -1/+1), but this batch has reward values "
    "{values}{more} (uid(s) {keys}). Other values come from a shaped reward: algorithm.use_kl_in_reward=True "
    "subtracts a KL penalty, an overlong/format penalty or partial credit adds levels. Use prior=gaussian, or a "
    "plain two-level reward."
)


@dataclass
class _GroupStats:
    """Per prompt group: the row -> group map, size g, mean mu_q, unbiased variance, reward range; the rows' x
    (pass indicator for EBPO-BB) sorted by value with their groups."""

    row_group: np.ndarray
    g: np.ndarray
    mu_q: np.ndarray
    var_q: np.ndarray
    r_min: np.ndarray
    r_max: np.ndarray
    x: np.ndarray
    x_sorted: np.ndarray
    group_of_sorted: np.ndarray


def _group_stats(uid_groups: Groups, lo: float, span: float) -> _GroupStats:
    """Step 3: the group moments of x (the pass indicator for EBPO-BB), summed in value order (independent of the row
    order and of the uid strings)."""
    row_group, n_groups, r = uid_groups.row_group.numpy(), len(uid_groups.keys), uid_groups.r.numpy()
    x = r if span == 1.0 and lo == 0.0 else (r - lo) / span  # BB: pass indicator 0/1
    order = np.argsort(x, kind="stable")
    x_sorted, group_of_sorted = x[order], row_group[order]
    m = Moments.of_segments(x_sorted, group_of_sorted, n_groups)  # every group has a row: n > 0
    var_q = np.where(m.n >= 2, m.m2 / np.maximum(m.n - 1.0, 1.0), 0.0)
    r_max = np.full(n_groups, -np.inf)
    np.maximum.at(r_max, row_group, r)
    r_min = np.full(n_groups, np.inf)
    np.minimum.at(r_min, row_group, r)
    return _GroupStats(row_group, m.n, m.mean, var_q, r_min, r_max, x, x_sorted, group_of_sorted)


def _shrinkage(groups: _GroupStats, priors: _Priors, group_prior: np.ndarray, options: EBPOOptions) -> np.ndarray:
    """Step 5: S_q per group (fixed; nu / (nu + G) for EBPO-BB; (sigma^2/G) / (sigma^2/G + tau^2 + eps), or the
    released code's form in batch scope)."""
    g, eps = groups.g, options.epsilon
    if options.fixed_shrinkage is not None:
        return np.full(len(g), options.fixed_shrinkage)
    if options.prior == "beta_binomial":
        nu = priors.nu[group_prior]
        return nu / (nu + g)
    noise = priors.sigma2[group_prior] / g
    denom = noise + priors.tau2[group_prior]
    if options.stats_scope == "batch":  # released code: no eps, S = 1 where the denominator is <= 1e-6
        big = denom > eps
        return np.where(big, noise / np.where(big, denom, 1.0), 1.0)
    return noise / (denom + eps)


def _normalised(
    adv: np.ndarray, groups: _GroupStats, shrink: np.ndarray, prior_sigma2: np.ndarray, span: float, opts: EBPOOptions
) -> np.ndarray:
    """Step 7: the ``norm`` option applied to the centred advantages."""
    eps = opts.epsilon
    if opts.norm == "batch":
        ordered = np.sort(adv)
        mean = ordered.sum() / ordered.size
        var = ((ordered - mean) ** 2).sum() / (ordered.size - 1) if ordered.size >= 2 else 0.0
        return (adv - mean) / (math.sqrt(var) + eps)
    if opts.norm == "group":
        scale = span * np.sqrt((1.0 - shrink) * groups.var_q + shrink * prior_sigma2)
        return adv / (scale[groups.row_group] + eps)
    if opts.stats_scope == "batch":  # released code with norm_adv_by_std_in_grpo=False: A - mean(A)
        return adv - sorted_mean(adv)
    return adv


def compute_ebpo_advantages(batch: Batch, options: EBPOOptions, state: EBPOState) -> Advantages:
    """Per-response EBPO advantages (shape ``(bs,)``, on the device of ``batch.scores``; padding rows, ``valid``
    False or a uid starting with ``pad_prefix``, get 0 and never touch the statistics) and the step's ``ebpo/*``
    diagnostics, the rows grouped by uid. ``scores`` may have any real dtype (the result: its dtype when floating,
    else torch's default); ``row_values``: the cluster labels (compared as strings; None/NaN = missing), required
    iff ``options.cluster_key``. ``state`` is updated in place (unless ``stats_scope="batch"``), unchanged on error.

    ``stats_scope="batch"`` is the released code (docs/paper_notes.md#released-code): sigma^2 = population variance
    of the batch's rewards, tau^2 = population variance of its group means, mu_glob = mean of the group means,
    S = (sigma^2/G_q) / (sigma^2/G_q + tau^2) where that denominator exceeds eps else 1, then
    (A - mean A) / (std A + eps) (unbiased std), or only A - mean A with ``norm="none"``.
    With ``prior="beta_binomial"`` and -1/+1 rewards the posterior mean p_q of the pass rate is an expected
    reward of 2 p_q - 1: the statistics are kept in pass units and advantages mapped back to reward units.
    """
    scores = torch.as_tensor(batch.scores)
    if scores.dim() != 1:
        raise ValueError(
            f"scores must have shape (bs,), one per response; got shape {tuple(scores.shape)} (sum token-level "
            "rewards over the response first)"
        )
    if scores.is_complex():
        raise ValueError(f"scores must be real numbers, got dtype {scores.dtype}")
    out_dtype = scores.dtype if scores.is_floating_point() else torch.get_default_dtype()
    uid_groups = batch._replace(scores=scores, valid=torch.as_tensor(batch.valid)).uid_groups()
    # Step 2: (lowest level, span) of the reward; EBPO-BB refuses a reward that is not two-level (0/1 or -1/+1)
    lo, span = pass_levels(uid_groups, BB_REFUSAL, fractions=False) if options.prior == "beta_binomial" else (0.0, 1.0)
    if len(uid_groups.keys) == 0:
        return Advantages(scatter_rows(scores, uid_groups, uid_groups.r), {})
    groups = _group_stats(uid_groups, lo, span)
    # each group's cluster, which picks its prior (all 0 without cluster_key: the global prior)
    cluster_names, group_cluster = _group_clusters(uid_groups, scores.shape[0], batch.row_values, options)
    # Step 4: this batch's statistics, the priors of every scope, each group's prior.
    batch_stats = _batch_stats(groups, group_cluster, None if cluster_names is None else len(cluster_names))
    stored, prior_stats = _next_statistics(state, batch_stats, cluster_names, options)
    scope_priors = _scope_priors(prior_stats, options)
    prompts = prior_stats.group_means.n[1:]
    priors = scope_priors if cluster_names is None else _cluster_priors(scope_priors, prompts, options)
    shrink = _shrinkage(groups, priors, group_cluster, options)
    # Step 6: the EB baseline; BB with -1/+1: reward minus the expected reward 2 p_q - 1
    baseline = (1.0 - shrink) * groups.mu_q + shrink * priors.mu[group_cluster]
    adv = span * (groups.x - baseline[groups.row_group])
    adv = _normalised(adv, groups, shrink, priors.sigma2[group_cluster], span, options)
    _check_range(adv, batch_stats.finite() and (stored is None or stored.finite), state, uid_groups, out_dtype)
    state.steps = saturated(state.steps)
    state.prompts_seen = saturated(state.prompts_seen, int(batch_stats.group_means.n[0]))
    state.responses_seen = saturated(state.responses_seen, int(batch_stats.rewards.n[0]))
    if stored is not None:
        state.global_stats, state.clusters = stored.global_stats, stored.clusters
    # ebpo/* metrics; prior moments in reward units (a -1/+1 BB reward: mu = 2 p - 1, variances x 4)
    diag = {
        "ebpo/shrinkage_mean": sorted_mean(shrink),
        "ebpo/shrinkage_min": float(shrink.min()),
        "ebpo/shrinkage_max": float(shrink.max()),
        "ebpo/mu_glob": float(lo + span * scope_priors.mu[0]),
        "ebpo/sigma2": float(span * span * scope_priors.sigma2[0]),
        "ebpo/tau2": float(span * span * scope_priors.tau2[0]),
        "ebpo/prompts_seen": float(state.prompts_seen),
        "ebpo/responses_seen": float(state.responses_seen),
        "ebpo/frac_zero_var_groups": float(np.count_nonzero(groups.r_max == groups.r_min) / groups.r_max.size),
        "ebpo/frac_all_fail": float(np.count_nonzero(groups.r_max <= 0) / groups.r_max.size),
        "ebpo/frac_all_pass": float(np.count_nonzero(groups.r_min >= 1) / groups.r_min.size),
    }
    if cluster_names:
        order = np.argsort(shrink)
        means = Moments.of_segments(shrink[order], group_cluster[order], len(cluster_names)).mean  # none empty
        for cid, name in enumerate(cluster_names):
            diag[f"ebpo/cluster/{name}/mu_glob"] = float(lo + span * priors.mu[cid])
            diag[f"ebpo/cluster/{name}/shrinkage_mean"] = float(means[cid])
    return Advantages(scatter_rows(scores, uid_groups, torch.from_numpy(adv)), diag)


def _check_range(adv: np.ndarray, stats_finite: bool, state: EBPOState, g: Groups, out_dtype: torch.dtype) -> None:
    """Step 8: the advantages and statistics are finite and the advantages fit ``out_dtype`` (before any commit);
    else ValueError naming the estimator call (``state.steps + 1``: one per training step since the statistics
    began, so verl's global step in a run that was never reset) and the uids with the largest rewards."""
    if not (np.isfinite(adv).all() and stats_finite):
        what = "non-finite"
    elif out_dtype != torch.float64 and adv.size and np.abs(adv).max() > torch.finfo(out_dtype).max:
        what = f"advantages above the {out_dtype} maximum"
    else:
        return
    mag = np.abs(g.r.numpy())
    offenders = g.keys_of(mag >= 0.01 * mag.max())
    raise ValueError(
        f"EBPO estimator call {state.steps + 1} (one per training step since the statistics began): the statistics or "
        f"advantages overflow ({what}) with rewards as large as {mag.max():.3g}; "
        f"largest rewards in uid(s) {offenders[:20]}. Scale the reward down; the running state was left unchanged."
    )


def _group_clusters(
    g: Groups, bs: int, labels: Sequence[Any] | np.ndarray | None, options: EBPOOptions
) -> tuple[list[str] | None, np.ndarray]:
    """Cluster id per group from per-row labels; every row of a group must carry the same label."""
    row_group, n_groups = g.row_group.numpy(), len(g.keys)
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
    row_cluster, names = factorize_keys(label_arr[g.rows.numpy()], missing=True)
    missing = row_cluster < 0
    if missing.any():
        raise ValueError(f"no {options.cluster_key!r} label (None/NaN) for uid(s) {g.keys_of(missing)[:20]}")
    group_cluster = np.full(n_groups, -1, dtype=np.int64)
    group_cluster[row_group] = row_cluster
    inconsistent = group_cluster[row_group] != row_cluster
    if inconsistent.any():
        raise ValueError(f"uid(s) {g.keys_of(inconsistent)[:20]} carry more than one {options.cluster_key!r} label")
    return names.tolist(), group_cluster


class _Stored(NamedTuple):
    """The running statistics to store after a batch (all prompts, each cluster label), and whether the merged ones
    are all finite."""

    global_stats: PriorStats
    clusters: dict[str, PriorStats]
    finite: bool


def _next_statistics(
    state: EBPOState, batch: PriorStats, cluster_names: list[str] | None, options: EBPOOptions
) -> tuple[_Stored | None, PriorStats]:
    """(the statistics to store after this batch, None in batch scope; the statistics the priors are built from, per
    scope). ``batch``: this batch's statistics, all prompts first, then each cluster. ``state`` is not changed: the
    caller commits once everything is known to be finite."""
    names = cluster_names or []
    if options.stats_scope == "batch":
        return None, batch
    decay = float(options.decay)
    past = PriorStats.stack([state.global_stats] + [state.clusters.get(n, PriorStats()) for n in names])
    past = past.scaled(decay)  # exponential forgetting: the weights shrink
    new = past.merged(batch)
    new_global, *new_clusters = new.unstack()
    clusters = {k: v.scaled(decay) for k, v in state.clusters.items()} if decay != 1.0 else dict(state.clusters)
    clusters.update(zip(names, new_clusters, strict=True))
    stored = _Stored(new_global, clusters, new.finite())
    if options.prior == "beta_binomial" or (options.merge == "after" and past.group_means.n[0] > 0):
        # A cluster without history falls back to the global prior through its blending weight of 0.
        return stored, past
    return stored, new


SPECS = (
    EstimatorSpec(
        "ebpo", "EBPO: A_i = r_i - [(1 - S) mu_q + S mu_glob], the group mean shrunk toward running statistics, "
        "standardised", "arXiv 2602.05165", compute=compute_ebpo_advantages, options_cls=EBPOOptions,
        state=StateSpec(EBPOState, "ebpo_state.json", "EBPO", "empirical-Bayes statistics",
                        mode_keys=("stats_scope", "prior", "shrinkage", "norm", "cluster_key"), ignored=ignored_keys),
        row_input="cluster_key", min_group=group_size_need, warning=ignored_options_warning,
        pass_rates=lambda o: (
            "prior=beta_binomial needs a two-level reward, 0/1 or -1/+1" if o.prior == "beta_binomial" else None
        ),
    ),
)  # fmt: skip
