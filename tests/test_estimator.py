"""EBPO estimator against independent computations: verl's grpo, closed forms, two-pass recomputations."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.ray_trainer import compute_advantage

from ebpo_verl.algos import registry
from ebpo_verl.algos.ebpo import EBPOOptions, ignored_options
from ebpo_verl.algos.ebpo_math import compute_ebpo_advantages
from ebpo_verl.algos.ebpo_state import EBPOState
from ebpo_verl.algos.estimator import Batch
from ebpo_verl.algos.moments import Moments
from ebpo_verl.trainer.adapter import DEFAULT_ESTIMATORS

EPS = 1e-6
DEFAULT = DEFAULT_ESTIMATORS["ebpo"]
"""The process's default ``ebpo`` instance: what verl's registry (stock ``main_ppo``) runs."""


@pytest.fixture(autouse=True)
def _fresh_state():
    DEFAULT.reset()
    yield
    DEFAULT.reset()


def make_batch(rng: np.random.Generator, sizes: list[int], p: np.ndarray | None = None, tag: str = "s0"):
    """Binary rewards for groups of the given sizes; returns (uids, rewards) in a shuffled row order."""
    p = rng.uniform(0, 1, len(sizes)) if p is None else p
    uids = np.concatenate([[f"{tag}-q{i}"] * n for i, n in enumerate(sizes)]).astype(object)
    rewards = np.concatenate([rng.binomial(1, p[i], n) for i, n in enumerate(sizes)]).astype(np.float64)
    perm = rng.permutation(len(uids))
    return uids[perm], rewards[perm]


def make_dataproto(uids: np.ndarray, rewards: np.ndarray, length: int = 5) -> DataProto:
    """A real DataProto: reward on the last valid token, response lengths 1..length."""
    bs = len(uids)
    lengths = 1 + np.arange(bs) % length
    mask = torch.from_numpy(np.arange(length)[None, :] < lengths[:, None]).float()
    tlr = torch.zeros(bs, length)
    tlr[torch.arange(bs), torch.from_numpy(lengths - 1)] = torch.from_numpy(rewards).float()
    return DataProto.from_dict(
        tensors={"token_level_rewards": tlr, "response_mask": mask}, non_tensors={"uid": np.asarray(uids)}
    )


def ebpo_step(uids, rewards, state=None, labels=None, **opts):
    """One ``ebpo`` call on ``state`` (None: the default instance, whose diagnostics it then holds)."""
    scores = torch.as_tensor(rewards, dtype=torch.float64)
    valid = torch.ones(len(uids), dtype=torch.bool)
    if state is None:
        DEFAULT.options = EBPOOptions(**opts)
        return DEFAULT(scores, uids, valid, labels)
    return compute_ebpo_advantages(Batch(scores, uids, valid, labels), EBPOOptions(**opts), state)


def run_ebpo(uids, rewards, state=None, labels=None, **opts) -> np.ndarray:
    return ebpo_step(uids, rewards, state, labels, **opts).values.double().numpy()


# ---------------------------------------------------------------- independent reference (two-pass, numpy)


def group_table(uids, rewards):
    keys = sorted(set(uids))
    groups = {k: rewards[uids == k] for k in keys}
    return groups


def two_pass_prior(history: list[tuple[np.ndarray, np.ndarray]], sigma2="total", tau2="raw", weights=None):
    """mu, sigma^2, tau^2 recomputed from scratch over every batch in ``history`` (optionally weighted)."""
    weights = np.ones(len(history)) if weights is None else np.asarray(weights)
    r_all, r_w, means, means_w, within, within_w, inv_g = [], [], [], [], [], [], []
    for (uids, rewards), w in zip(history, weights, strict=True):
        r_all.append(rewards)
        r_w.append(np.full(len(rewards), w))
        for g in group_table(uids, rewards).values():
            means.append(g.mean())
            means_w.append(w)
            inv_g.append(1.0 / len(g))
            if len(g) >= 2:
                within.append(g.var(ddof=1))
                within_w.append(w)
    r_all, r_w = np.concatenate(r_all), np.concatenate(r_w)
    means, means_w = np.array(means), np.array(means_w)
    mu = np.average(r_all, weights=r_w)
    total = np.average((r_all - mu) ** 2, weights=r_w)
    mean_of_means = np.average(means, weights=means_w)
    raw_tau2 = np.average((means - mean_of_means) ** 2, weights=means_w)
    s2 = total if sigma2 == "total" else np.average(within, weights=within_w)
    t2 = raw_tau2 if tau2 == "raw" else max(raw_tau2 - s2 * np.average(inv_g, weights=means_w), 0.0)
    return mu, s2, t2


def reference_advantages(uids, rewards, mu, s2, t2, norm="batch", shrinkage=None):
    groups = group_table(uids, rewards)
    raw = np.empty(len(rewards))
    for i, (u, r) in enumerate(zip(uids, rewards, strict=True)):
        g = groups[u]
        s = (s2 / len(g)) / (s2 / len(g) + t2 + EPS) if shrinkage is None else shrinkage
        v = (1 - s) * g.mean() + s * mu
        raw[i] = r - v
        if norm == "group":
            sq = g.var(ddof=1) if len(g) > 1 else 0.0
            raw[i] /= np.sqrt((1 - s) * sq + s * s2) + EPS
    if norm == "batch":
        return (raw - raw.mean()) / (raw.std(ddof=1) + EPS)
    return raw


# ---------------------------------------------------------------- equivalences with verl and closed forms


def test_shrinkage_zero_group_norm_equals_verl_grpo():
    rng = np.random.default_rng(0)
    uids, rewards = make_batch(rng, [4, 4, 2, 3, 8, 4, 5], p=np.array([0.5, 0.0, 1.0, 0.3, 0.6, 0.9, 0.2]))
    algo = OmegaConf.create({"ebpo": {"shrinkage": 0.0, "norm": "group"}})
    ours = compute_advantage(make_dataproto(uids, rewards), "ebpo", config=algo).batch["advantages"]
    grpo = compute_advantage(make_dataproto(uids, rewards), "grpo", norm_adv_by_std_in_grpo=True).batch["advantages"]
    vec_fn = get_adv_estimator_fn("grpo_vectorized")
    data = make_dataproto(uids, rewards)
    vec, _ = vec_fn(data.batch["token_level_rewards"], data.batch["response_mask"], uids)
    assert grpo.abs().sum() > 0
    torch.testing.assert_close(ours, grpo, atol=1e-6, rtol=0)
    torch.testing.assert_close(ours, vec, atol=1e-6, rtol=0)


def test_group_of_one_differs_from_verl_grpo_by_design():
    """verl's grpo scores a lone response by its raw reward (mean 0, std 1); the EB group form gives it 0."""
    uids = np.array(["a", "a", "a", "solo"], dtype=object)
    rewards = np.array([1.0, 0.0, 1.0, 1.0])
    algo = OmegaConf.create({"ebpo": {"shrinkage": 0.0, "norm": "group"}})
    ours = compute_advantage(make_dataproto(uids, rewards), "ebpo", config=algo).batch["advantages"][:, 0]
    grpo = compute_advantage(make_dataproto(uids, rewards), "grpo").batch["advantages"][:, 0]
    torch.testing.assert_close(ours[:3], grpo[:3], atol=1e-6, rtol=0)
    assert ours[3] == 0 and grpo[3] == pytest.approx(1.0, abs=1e-5)


def test_shrinkage_zero_no_norm_is_reward_minus_group_mean():
    rng = np.random.default_rng(1)
    uids, rewards = make_batch(rng, [3, 5, 1, 4])
    got = run_ebpo(uids, rewards, shrinkage=0.0, norm="none")
    means = {u: rewards[uids == u].mean() for u in set(uids)}
    np.testing.assert_allclose(got, rewards - np.array([means[u] for u in uids]), atol=1e-7)


def released_code(uids, rewards, norm_by_std=True) -> np.ndarray:
    """docs/paper_notes.md#released-code, as a plain Python loop over the responses."""

    def pvar(xs):  # Welford's population variance; 0 with fewer than two values
        if len(xs) < 2:
            return 0.0
        m = sum(xs) / len(xs)
        return sum((x - m) ** 2 for x in xs) / len(xs)

    groups: dict = {}
    for u, r in zip(uids, rewards, strict=True):
        groups.setdefault(u, []).append(float(r))
    means = {u: sum(v) / len(v) for u, v in groups.items()}
    sigma2, tau2 = pvar([float(r) for r in rewards]), pvar(list(means.values()))
    mu_glob = sum(means.values()) / len(means)
    raw = []
    for u, r in zip(uids, rewards, strict=True):
        k = len(groups[u])
        denom = sigma2 / k + tau2
        s = (sigma2 / k) / denom if denom > 1e-6 else 1.0
        raw.append(float(r) - ((1 - s) * means[u] + s * mu_glob))
    mean = sum(raw) / len(raw)
    if not norm_by_std:
        return np.array([a - mean for a in raw])
    std = (sum((a - mean) ** 2 for a in raw) / (len(raw) - 1)) ** 0.5
    return np.array([(a - mean) / (std + 1e-6) for a in raw])


@pytest.mark.parametrize("norm", ["batch", "none"])
def test_batch_scope_is_the_released_code_on_unequal_groups(norm):
    rng = np.random.default_rng(2)
    for step in range(3):  # no memory across calls
        sizes = list(rng.integers(1, 9, 40))
        uids, rewards = make_batch(rng, sizes, tag=f"s{step}")
        if step == 2:
            rewards = np.round(rng.normal(0.3, 2.0, len(uids)), 2)  # any reward scale
        got = run_ebpo(uids, rewards, stats_scope="batch", norm=norm)
        expected = released_code(uids, rewards, norm_by_std=norm == "batch")
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
        means = [rewards[uids == u].mean() for u in set(uids)]
        assert DEFAULT.diagnostics["ebpo/mu_glob"] == pytest.approx(np.mean(means), abs=1e-15)
        assert np.mean(means) != pytest.approx(rewards.mean(), abs=1e-3)  # unequal groups: the two means differ
    assert DEFAULT.state.global_stats.group_means.n == 0  # batch scope leaves the history untouched


def test_batch_scope_near_constant_batch_uses_the_global_mean():
    """sigma^2/k + tau^2 <= 1e-6: the released code sets S = 1 (baseline = mean of group means)."""
    rng = np.random.default_rng(3)
    uids, _ = make_batch(rng, [4, 2, 3, 4, 1, 4])
    rewards = 0.5 + rng.normal(0, 3e-4, len(uids))
    got = run_ebpo(uids, rewards, stats_scope="batch")
    expected = released_code(uids, rewards)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)
    assert DEFAULT.diagnostics["ebpo/shrinkage_min"] == 1.0
    # with the eps of the history formula the same batch gets S = noise / (noise + tau2 + eps) ~ 0.1: different
    other = run_ebpo(uids, rewards, state=EBPOState(), stats_scope="history")
    assert np.abs(other - expected).max() > 0.1


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"sigma2": "within", "tau2": "debiased"},
        {"merge": "after"},
        {"norm": "group"},
        {"norm": "none", "decay": 0.7},
    ],
    ids=["default", "within-debiased", "merge-after", "norm-group", "decay"],
)
def test_history_equals_two_pass_over_all_rewards_seen(opts):
    rng = np.random.default_rng(3)
    history = []
    decay = opts.get("decay", 1.0)
    for step in range(5):
        sizes = list(rng.integers(1, 7, size=int(rng.integers(5, 30))))  # variable sizes, groups of one
        uids, rewards = make_batch(rng, sizes, tag=f"s{step}")
        got = run_ebpo(uids, rewards, **opts)
        history.append((uids, rewards))
        past = history[:-1] if opts.get("merge") == "after" and step > 0 else history
        weights = [decay ** (len(history) - 1 - t) for t in range(len(past))]
        mu, s2, t2 = two_pass_prior(past, opts.get("sigma2", "total"), opts.get("tau2", "raw"), weights)
        expected = reference_advantages(uids, rewards, mu, s2, t2, norm=opts.get("norm", "batch"))
        np.testing.assert_allclose(got, expected, atol=1e-6, err_msg=f"step {step}")


def test_chan_merges_are_sound_over_a_million_values():
    """200,000 merges (1M values, offset 1e6) agree with a float64 two-pass mean and variance."""
    rng = np.random.default_rng(4)
    values = 1e6 + rng.normal(0, 1, (200_000, 5))
    acc = Moments()
    for chunk in values:
        mean = chunk.mean()
        acc = acc.merged(Moments(len(chunk), mean, float(((chunk - mean) ** 2).sum())))
    assert acc.n == values.size
    assert acc.mean == pytest.approx(values.mean(), rel=1e-13)
    assert acc.m2 / acc.n == pytest.approx(values.var(), rel=1e-9)


def test_history_statistics_over_many_steps_match_two_pass():
    rng = np.random.default_rng(5)
    state = EBPOState()
    all_r, all_means = [], []
    for step in range(500):
        r = 1e3 + rng.normal(0, 1, 8)
        uids = np.array([f"{step}-a"] * 4 + [f"{step}-b"] * 4, dtype=object)
        run_ebpo(uids, r, state=state, norm="none")
        all_r.append(r)
        all_means += [r[:4].mean(), r[4:].mean()]
    all_r = np.concatenate(all_r)
    stats = state.global_stats
    assert stats.rewards.mean == pytest.approx(all_r.mean(), rel=1e-13)
    assert stats.rewards.m2 / stats.rewards.n == pytest.approx(all_r.var(), rel=1e-10)
    assert stats.group_means.m2 / stats.group_means.n == pytest.approx(np.var(all_means), rel=1e-10)
    assert state.prompts_seen == 1_000 and state.responses_seen == 4_000


# ---------------------------------------------------------------- the claimed properties


def test_all_fail_negative_and_all_pass_positive():
    uids = np.array(["fail"] * 4 + ["pass"] * 4 + ["mix"] * 4, dtype=object)
    rewards = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 1, 0], dtype=np.float64)
    ebpo = run_ebpo(uids, rewards)
    assert 0 < DEFAULT.diagnostics["ebpo/mu_glob"] < 1
    assert (ebpo[:4] < 0).all() and (ebpo[4:8] > 0).all()
    grpo = compute_advantage(make_dataproto(uids, rewards), "grpo").batch["advantages"].sum(-1).numpy()
    assert (grpo[:8] == 0).all()
    # raw form: A = -S mu_glob for all-fail, +S (1 - mu_glob) for all-pass, on a later step too
    DEFAULT.state.reset()
    uids2 = np.char.add(uids.astype(str), "-2").astype(object)
    run_ebpo(uids, rewards, norm="none")
    raw = run_ebpo(uids2, rewards, norm="none")
    mu, s2, t2 = two_pass_prior([(uids, rewards), (uids2, rewards)])
    s = (s2 / 4) / (s2 / 4 + t2 + EPS)
    d = DEFAULT.diagnostics
    assert d["ebpo/shrinkage_mean"] == pytest.approx(s) and d["ebpo/mu_glob"] == pytest.approx(mu)
    np.testing.assert_allclose(raw[:4], -s * mu, atol=1e-7)
    np.testing.assert_allclose(raw[4:8], s * (1 - mu), atol=1e-7)
    assert d["ebpo/frac_all_fail"] == pytest.approx(1 / 3) and d["ebpo/frac_all_pass"] == pytest.approx(1 / 3)
    assert d["ebpo/frac_zero_var_groups"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("g", [2, 4, 8, 16])
def test_beta_bernoulli_mse_below_sample_mean_and_near_closed_form(g):
    """theta ~ Beta(0.6, 1.4): with consistent sigma^2/tau^2 estimates the EB baseline's MSE is (1 - S) sigma^2 / G."""
    rng = np.random.default_rng(10 + g)
    n_prompts, a, b = 20_000, 0.6, 1.4
    theta = rng.beta(a, b, n_prompts)
    uids = np.repeat(np.arange(n_prompts).astype(str), g).astype(object)
    rewards = rng.binomial(1, np.repeat(theta, g)).astype(np.float64)
    sigma2_true = a * b / ((a + b) * (a + b + 1))  # E[theta (1 - theta)]
    tau2_true = a * b / ((a + b) ** 2 * (a + b + 1))  # Var(theta)
    s_true = (sigma2_true / g) / (sigma2_true / g + tau2_true)
    sample_mean = rewards.reshape(n_prompts, g).mean(1)
    mse_sample = np.mean((sample_mean - theta) ** 2)
    for opts, tol in (({"sigma2": "within", "tau2": "debiased"}, 0.05), ({}, None)):
        DEFAULT.state.reset()
        adv = run_ebpo(uids, rewards, norm="none", **opts)
        baseline = (rewards - adv).reshape(n_prompts, g)[:, 0]
        mse_eb = np.mean((baseline - theta) ** 2)
        assert mse_eb < mse_sample
        if tol is not None:
            assert mse_eb == pytest.approx((1 - s_true) * sigma2_true / g, rel=tol)
            assert mse_sample == pytest.approx(sigma2_true / g, rel=tol)


def test_beta_binomial_prior_closed_form():
    """EBPO-BB: Beta(1,1) warm-up, then method of moments on the previous batches' pass rates."""
    rng = np.random.default_rng(5)
    uids1, r1 = make_batch(rng, [4] * 50, tag="a")
    got1 = run_ebpo(uids1, r1, prior="beta_binomial", norm="none")
    succ1 = {u: r1[uids1 == u].sum() for u in set(uids1)}
    np.testing.assert_allclose(got1, r1 - np.array([(1 + succ1[u]) / (2 + 4) for u in uids1]), atol=1e-7)
    uids2, r2 = make_batch(rng, [4] * 50, tag="b")
    got2 = run_ebpo(uids2, r2, prior="beta_binomial", norm="none")
    rates = np.array([r1[uids1 == u].mean() for u in set(uids1)])
    p, v = rates.mean(), rates.var()
    assert 1e-6 < v < p * (1 - p) - 1e-6
    nu = p * (1 - p) / v - 1
    alpha = nu * p
    succ2 = {u: r2[uids2 == u].sum() for u in set(uids2)}
    np.testing.assert_allclose(got2, r2 - np.array([(alpha + succ2[u]) / (nu + 4) for u in uids2]), atol=1e-7)


def test_clusters_use_per_label_statistics_blended_toward_global():
    rng = np.random.default_rng(6)
    history, labels_hist = [], []
    for step in range(3):
        uids, rewards = make_batch(rng, [4] * 40, tag=f"s{step}")
        labels = np.array(["easy" if int(u.split("q")[1]) % 2 else "hard" for u in uids], dtype=object)
        rewards = np.where(labels == "easy", np.maximum(rewards, rng.binomial(1, 0.8, len(rewards))), rewards * 0.0)
        got = run_ebpo(uids, rewards, labels=labels, cluster_key="topic", min_cluster_prompts=50, norm="none")
        history.append((uids, rewards))
        labels_hist.append(labels)
        mu_g, s2_g, t2_g = two_pass_prior(history)
        expected = np.empty(len(rewards))
        for lab in ("easy", "hard"):
            sub = [(u[lb == lab], r[lb == lab]) for (u, r), lb in zip(history, labels_hist, strict=True)]
            mu_c, s2_c, t2_c = two_pass_prior(sub)
            w = min(1.0, 20 * (step + 1) / 50)
            mu, s2, t2 = (w * x + (1 - w) * y for x, y in ((mu_c, mu_g), (s2_c, s2_g), (t2_c, t2_g)))
            rows = labels == lab
            expected[rows] = reference_advantages(uids[rows], rewards[rows], mu, s2, t2, norm="none")
        np.testing.assert_allclose(got, expected, atol=1e-7, err_msg=f"step {step}")
    diag = DEFAULT.diagnostics
    assert diag["ebpo/cluster/easy/mu_glob"] > diag["ebpo/mu_glob"] > diag["ebpo/cluster/hard/mu_glob"]


@pytest.mark.parametrize("prior", ["gaussian", "beta_binomial"])
def test_a_label_without_history_falls_back_to_the_global_prior(prior):
    """merge=after (and BB, which always uses earlier batches): a new label's first batch uses the global prior."""
    rng = np.random.default_rng(9)
    opts = {"merge": "after", "prior": prior, "norm": "none"}
    uids1, r1 = make_batch(rng, [4] * 30, tag="s1")
    uids2, r2 = make_batch(rng, [4] * 10, tag="s2")
    for uids, r, label in ((uids1, r1, "old"), (uids2, r2, "new")):
        labels = np.full(len(uids), label, dtype=object)
        got = run_ebpo(uids, r, labels=labels, cluster_key="topic", min_cluster_prompts=0, **opts)
    no_clusters = EBPOState()
    run_ebpo(uids1, r1, state=no_clusters, **opts)
    expected = run_ebpo(uids2, r2, state=no_clusters, **opts)
    np.testing.assert_allclose(got, expected, atol=1e-12)
    assert np.abs(got).sum() > 0


def test_cluster_errors_name_the_problem():
    uids = np.array(["a", "a", "b", "b"], dtype=object)
    r = np.array([1.0, 0, 0, 1])
    with pytest.raises(ValueError, match="ebpo_verl.main"):
        run_ebpo(uids, r, cluster_key="topic")
    with pytest.raises(ValueError, match=r"'b'"):
        run_ebpo(uids, r, cluster_key="topic", labels=np.array(["x", "x", None, "y"], dtype=object))
    with pytest.raises(ValueError, match=r"more than one 'topic' label"):
        run_ebpo(uids, r, cluster_key="topic", labels=np.array(["x", "x", "y", "z"], dtype=object))


# ---------------------------------------------------------------- bad input, padding, state


def test_padding_rows_get_zero_and_leave_statistics_untouched():
    rng = np.random.default_rng(7)
    uids, rewards = make_batch(rng, [4, 4, 4])
    clean = make_dataproto(uids, rewards)
    ref = compute_advantage(clean, "ebpo", config=None).batch["advantages"]
    ref_state = DEFAULT.state.state_dict()
    DEFAULT.state.reset()
    pad_uids = np.concatenate([uids, ["pad_0", "pad_1", "q-masked"]]).astype(object)
    padded = make_dataproto(pad_uids, np.concatenate([rewards, [1.0, 0.0, 1.0]]))
    padded.batch["response_mask"][-1] = 0  # a row with an all-zero mask is padding too
    padded.batch["token_level_rewards"][-1] = 0
    got = compute_advantage(padded, "ebpo", config=None).batch["advantages"]
    torch.testing.assert_close(got[:12], ref)
    assert (got[12:] == 0).all()
    assert DEFAULT.state.state_dict() == ref_state


def test_non_finite_rewards_name_the_uids():
    uids = np.array(["ok", "ok", "bad1", "bad1", "bad2"], dtype=object)
    with pytest.raises(ValueError, match=r"\['bad1', 'bad2'\]"):
        run_ebpo(uids, np.array([1.0, 0.0, np.nan, 1.0, np.inf]))
    assert DEFAULT.state.prompts_seen == 0


def test_groups_of_one_contribute_to_mu_and_tau_but_not_within_variance():
    uids = np.array(["solo", "pair", "pair"], dtype=object)
    run_ebpo(uids, np.array([1.0, 0.0, 1.0]), norm="none")
    stats = DEFAULT.state.global_stats
    assert stats.rewards.n == 3 and stats.group_means.n == 2 and stats.within_var.n == 1
    assert stats.within_var.mean == pytest.approx(0.5)
    assert stats.group_means.m2 / stats.group_means.n == pytest.approx(np.var([1.0, 0.5]))


def test_state_dict_round_trip_gives_bit_equal_advantages():
    rng = np.random.default_rng(8)
    batches = [make_batch(rng, list(rng.integers(1, 6, 20)), tag=f"s{t}") for t in range(6)]
    opts = {"cluster_key": "topic", "decay": 0.9, "min_cluster_prompts": 10}
    labels = [np.array([str(hash(u) % 3) for u in uids], dtype=object) for uids, _ in batches]
    straight = EBPOState()
    expected = [run_ebpo(u, r, state=straight, labels=lab, **opts) for (u, r), lab in zip(batches, labels, strict=True)]
    first = EBPOState()
    for (u, r), lab in zip(batches[:3], labels[:3], strict=True):
        run_ebpo(u, r, state=first, labels=lab, **opts)
    resumed = EBPOState()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for t in range(3, 6):
        got = run_ebpo(*batches[t], state=resumed, labels=labels[t], **opts)
        assert np.array_equal(got, expected[t])
    assert resumed.state_dict() == straight.state_dict()


def test_state_dict_rejects_other_versions():
    with pytest.raises(ValueError, match="version"):
        EBPOState().load_state_dict({"version": 99})


@pytest.mark.parametrize(
    ("mapping", "pattern"),
    [
        ({"priorr": "gaussian"}, r"unknown option algorithm\.ebpo\.priorr; did you mean .*prior\? valid keys"),
        ({"norm": "std"}, r"norm='std' is invalid; use batch, group or none"),
        ({"shrinkage": 1.5}, r"shrinkage=1.5.*\[0, 1\]"),
        ({"shrinkage": "half"}, r"shrinkage='half'"),
        ({"decay": 0.0}, r"decay=0.0"),
        ({"min_cluster_prompts": -1}, r"min_cluster_prompts=-1"),
    ],
)
def test_invalid_options_list_the_valid_ones(mapping, pattern):
    with pytest.raises(ValueError, match=pattern):
        EBPOOptions.from_mapping(OmegaConf.create(mapping))


def test_options_from_omegaconf_node_and_none():
    assert EBPOOptions.from_mapping(None) == EBPOOptions()
    opts = EBPOOptions.from_mapping(OmegaConf.create({"shrinkage": 0, "cluster_key": "topic"}))
    assert opts.fixed_shrinkage == 0.0 and opts.cluster_key == "topic"


# ---------------------------------------------------------------- EBPO-BB reward levels


def test_beta_binomial_plus_minus_one_is_the_posterior_mean_in_reward_units():
    """-1/+1 rewards: pass rate p_q from the +1 count, baseline 2 p_q - 1 (the expected reward)."""
    rng = np.random.default_rng(11)
    uids1, r01 = make_batch(rng, [4] * 30, tag="a")
    pm1 = 2 * r01 - 1
    got1 = run_ebpo(uids1, pm1, prior="beta_binomial", norm="none")
    succ = {u: (pm1[uids1 == u] == 1).sum() for u in set(uids1)}
    np.testing.assert_allclose(got1, pm1 - np.array([2 * (1 + succ[u]) / (2 + 4) - 1 for u in uids1]), atol=1e-12)
    uids2, r2 = make_batch(rng, [4] * 30, tag="b")
    pm2 = 2 * r2 - 1
    got2 = run_ebpo(uids2, pm2, prior="beta_binomial", norm="none")
    rates = np.array([r01[uids1 == u].mean() for u in set(uids1)])
    p, v = rates.mean(), rates.var()
    nu = p * (1 - p) / v - 1
    succ2 = {u: r2[uids2 == u].sum() for u in set(uids2)}
    expected = pm2 - np.array([2 * (nu * p + succ2[u]) / (nu + 4) - 1 for u in uids2])
    np.testing.assert_allclose(got2, expected, atol=1e-12)
    assert DEFAULT.diagnostics["ebpo/mu_glob"] == pytest.approx(2 * p - 1)
    # the same stream as 0/1 rewards gives half the raw advantage and the same statistics
    zero_one = EBPOState()
    run_ebpo(uids1, r01, state=zero_one, prior="beta_binomial", norm="none")
    np.testing.assert_array_equal(run_ebpo(uids2, r2, state=zero_one, prior="beta_binomial", norm="none") * 2, got2)
    assert zero_one.state_dict() == DEFAULT.state.state_dict()


@pytest.mark.parametrize(
    "rewards", [[0, 1, 2.0, 0], [0, 1, 0.93, 1], [1, 1, -1, 0]], ids=["outside", "kl-shaped", "three-levels"]
)
def test_beta_binomial_refuses_other_rewards_naming_the_cause(rewards):
    with pytest.raises(ValueError, match=r"two-level reward.*'q1'.*use_kl_in_reward"):
        run_ebpo(np.array(["q0", "q0", "q1", "q1"], dtype=object), np.array(rewards), prior="beta_binomial")
    assert DEFAULT.state.steps == 0


# ---------------------------------------------------------------- input types and shapes, labels


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool, torch.float16, torch.bfloat16])
def test_any_real_score_dtype_gives_float_advantages(dtype):
    uids = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
    rewards = [1, 0, 1, 0, 0, 1]
    batch = Batch(torch.tensor(rewards).to(dtype), uids, torch.ones(6, dtype=torch.bool))
    got = compute_ebpo_advantages(batch, EBPOOptions(), EBPOState()).values
    assert got.dtype == (dtype if dtype.is_floating_point else torch.get_default_dtype())
    expected = run_ebpo(uids, np.array(rewards, dtype=np.float64), state=EBPOState())
    np.testing.assert_allclose(
        got.double().numpy(), expected, atol=1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
    )
    assert np.abs(expected).max() > 0.5


def test_wrong_shapes_raise_a_clear_value_error():
    fn = get_adv_estimator_fn("ebpo")
    uids = np.array(["a", "a"], dtype=object)
    with pytest.raises(ValueError, match=r"scores must have shape \(bs,\).*\(2, 3\)"):
        compute_ebpo_advantages(
            Batch(torch.zeros(2, 3), uids, torch.ones(2, dtype=torch.bool)), EBPOOptions(), EBPOState()
        )
    with pytest.raises(ValueError, match=r"response_length >= 1.*\(2, 0\)"):
        fn(token_level_rewards=torch.zeros(2, 0), response_mask=torch.zeros(2, 0), index=uids)
    with pytest.raises(ValueError, match=r"one shape.*\(2, 3\) and \(2, 4\)"):
        fn(token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 4), index=uids)
    with pytest.raises(ValueError, match=r"must have shape \(2,\)"):
        fn(token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3), index=uids[:1])


@pytest.mark.parametrize("missing", [float("nan"), np.nan, None, pd.NA])
def test_nan_labels_count_as_missing(missing):
    uids = np.array(["a", "a", "b", "b"], dtype=object)
    labels = np.array(["x", "x", missing, missing], dtype=object)
    with pytest.raises(ValueError, match=r"no 'topic' label.*\['b'\]"):
        run_ebpo(uids, np.array([1.0, 0, 0, 1]), cluster_key="topic", labels=labels)
    assert DEFAULT.state.steps == 0


def test_labels_and_uids_compare_as_strings():
    """1 and "1" are one label (and one prompt), as before the hash-based factorisation."""
    uids = np.array([7, "7", "b", "b"], dtype=object)
    labels = np.array([1, "1", "1", 1.5], dtype=object)
    with pytest.raises(ValueError, match=r"\['b'\] carry more than one"):
        run_ebpo(uids, np.array([1.0, 0, 0, 1]), cluster_key="topic", labels=labels)
    got = run_ebpo(uids, np.array([1.0, 0, 0, 1]), state=EBPOState(), shrinkage=0.0, norm="none")
    np.testing.assert_allclose(got, [0.5, -0.5, -0.5, 0.5])


# ---------------------------------------------------------------- overflow and the saved state


def test_a_reward_beyond_the_limit_is_an_error_naming_uids_and_leaves_the_state():
    # 1e155 squared overflows float64: refused with the uids before any statistic (grouping.REWARD_LIMIT)
    rng = np.random.default_rng(12)
    uids, rewards = make_batch(rng, [4] * 8)
    run_ebpo(uids, rewards, cluster_key="topic", labels=np.full(len(uids), "t", dtype=object))
    before = DEFAULT.state.state_dict()
    big_uids = np.array(["ok", "ok", "huge", "huge"], dtype=object)
    with pytest.raises(ValueError, match=r"rewards beyond \+-1e\+30 for uid\(s\) \['huge'\]"):
        run_ebpo(
            big_uids,
            np.array([0.0, 1.0, 1e155, 0.0]),
            cluster_key="topic",
            labels=np.full(4, "t", dtype=object),
        )
    assert DEFAULT.state.state_dict() == before
    assert all(np.isfinite(v) for v in json.loads(json.dumps(before))["global"]["rewards"])


def _valid_state_dict() -> dict:
    rng = np.random.default_rng(13)
    uids, rewards = make_batch(rng, [3] * 6)
    state = EBPOState()
    run_ebpo(uids, rewards, state=state, cluster_key="topic", labels=np.full(len(uids), "t", dtype=object))
    return json.loads(json.dumps(state.state_dict()))


@pytest.mark.parametrize(
    ("corrupt", "pattern"),
    [
        (lambda d: d["global"]["rewards"].pop(), r"rewards=\[.*must be a list \[n, mean, m2\]"),
        (lambda d: d["global"]["rewards"].__setitem__(0, -1.0), r"rewards.n=-1.0 .* in \[0, 2\*\*53\]"),
        (lambda d: d["global"]["within_var"].__setitem__(2, -0.5), r"within_var.m2=-0.5 .* \[0, 1e300\]"),
        (lambda d: d["clusters"]["t"]["group_means"].__setitem__(1, float("inf")), r"\['t'\].group_means.mean=inf is"),
        (lambda d: d["global"]["rewards"].__setitem__(1, float("nan")), r"rewards.mean=nan .* \[-1e100, 1e100\]"),
        (lambda d: d["global"]["rewards"].__setitem__(1, "0.5"), r"global.rewards.mean='0.5' is refused"),
        (lambda d: d.__setitem__("steps", -3), r"EBPO state: steps=-3 .* \[0, 2\*\*53\]"),
        (lambda d: d.__setitem__("prompts_seen", 2.5), r"prompts_seen=2.5 is refused: it must be an integer"),
        (lambda d: d["clusters"].__setitem__("t", [1, 2]), r"\['t'\]=\[1, 2\] .* a JSON object"),
        (lambda d: d.__setitem__("clusters", []), r"clusters=\[\] is refused: it must be an object"),
        (lambda d: d["global"].pop("inv_group_size"), r"global missing field\(s\) \['inv_group_size'\]"),
    ],
)
def test_state_dict_validates_every_field_and_changes_nothing_on_error(corrupt, pattern):
    good = _valid_state_dict()
    state = EBPOState()
    state.load_state_dict(good)
    before = state.state_dict()
    bad = json.loads(json.dumps(good))
    corrupt(bad)
    with pytest.raises(ValueError, match=pattern):
        state.load_state_dict(bad)
    assert state.state_dict() == before


# ---------------------------------------------------------------- options a mode ignores


@pytest.mark.parametrize(
    ("opts", "expected"),
    [
        ({}, []),
        ({"stats_scope": "batch", "decay": 0.9, "merge": "after"}, ["merge='after'", "decay=0.9"]),
        ({"stats_scope": "batch"}, []),
        ({"prior": "beta_binomial", "sigma2": "within", "tau2": "debiased"}, ["sigma2='within'", "tau2='debiased'"]),
        ({"shrinkage": 0.5, "tau2": "debiased", "sigma2": "within"}, ["sigma2='within'", "tau2='debiased'"]),
        ({"shrinkage": 0.5, "norm": "group", "sigma2": "within"}, []),
        ({"min_cluster_prompts": 8}, ["min_cluster_prompts=8"]),
        ({"min_cluster_prompts": 8, "cluster_key": "topic"}, []),
    ],
)
def test_ignored_options_lists_what_the_mode_does_not_read(opts, expected):
    assert ignored_options(EBPOOptions(**opts)) == expected
    if expected:  # the estimator really does not read them: same advantages with the defaults of those keys
        rng = np.random.default_rng(14)
        batches = [make_batch(rng, [2, 3, 4, 4, 1], tag=f"s{t}") for t in range(3)]
        labels = [np.full(len(u), "t", dtype=object) for u, _ in batches]
        base = {k: v for k, v in opts.items() if f"{k}=" not in " ".join(expected)}
        a, b = EBPOState(), EBPOState()
        for (u, r), lab in zip(batches, labels, strict=True):
            r = 2 * r - 1 if opts.get("prior") == "beta_binomial" else r
            got = run_ebpo(u, r, state=a, labels=lab, **opts)
            ref = run_ebpo(u, r, state=b, labels=lab, **base)
            np.testing.assert_array_equal(got, ref)


# ---------------------------------------------------------------- registration
# (in a fresh Ray worker through the entry point alone, ebpo with the baselines: tests/test_baselines.py)


# ---------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    seed=st.integers(0, 2**31 - 1),
    scale=st.sampled_from([1.0, 5.0, 1e3]),
    opts=st.sampled_from([{}, {"sigma2": "within", "tau2": "debiased"}, {"norm": "group"}, {"merge": "after"}]),
)
def test_shrinkage_in_unit_interval_and_results_independent_of_row_order_and_uid_strings(sizes, seed, scale, opts):
    rng = np.random.default_rng(seed)
    uids, _ = make_batch(rng, sizes)
    rewards = np.round(rng.normal(0, scale, len(uids)), 3)
    state = EBPOState()
    run_ebpo(*make_batch(rng, [3, 3], tag="warm"), state=state, **opts)
    snapshot = state.state_dict()
    adv, d = ebpo_step(uids, rewards, state=state, **opts)
    adv = adv.double().numpy()
    assert 0.0 <= d["ebpo/shrinkage_min"] <= d["ebpo/shrinkage_max"] <= 1.0
    assert np.isfinite(adv).all()
    # rows in another order under fresh uid strings (what a resumed run sees): bit-identical results and state
    perm = rng.permutation(len(uids))
    fresh = {u: f"other-{rng.integers(1 << 40)}" for u in set(uids)}
    relabelled = np.array([fresh[u] for u in uids[perm]], dtype=object)
    again = EBPOState()
    again.load_state_dict(snapshot)
    permuted, again_d = ebpo_step(relabelled, rewards[perm], state=again, **opts)
    assert np.array_equal(permuted.double().numpy(), adv[perm])
    assert again.state_dict() == state.state_dict() and again_d == d


# ---------------------------------------------------------------- pre-flight of the estimator options


@pytest.fixture
def _composed(compose_config):
    """``_composed(*overrides)``: the package config (tests/conftest.py's composer)."""
    return compose_config


@pytest.mark.parametrize(
    "override",
    [
        "algorithm.use_kl_in_reward=True",
        "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
        "reward.reward_model.enable=True",
    ],
)
def test_preflight_refuses_beta_binomial_with_a_shaped_reward(override, _composed):
    from ebpo_verl.ops.errors import EBPOConfigError
    from ebpo_verl.trainer.preflight import check_config

    key = override.lstrip("+").split("=")[0]
    with pytest.raises(
        EBPOConfigError, match=rf"adv_estimator=ebpo needs .*prior=beta_binomial needs a two-level reward.*{key}=True"
    ):
        check_config(_composed("algorithm.ebpo.prior=beta_binomial", override))
    assert check_config(_composed(override)).estimator is not None  # the Gaussian prior takes any reward


def test_preflight_refuses_each_legacy_reward_key_naming_the_key_that_replaced_it(_composed):
    from omegaconf import OmegaConf

    from ebpo_verl.ops.errors import EBPOConfigError
    from ebpo_verl.trainer.preflight import check_config
    from ebpo_verl.trainer.preflight.config import LEGACY_REWARD_KEYS

    base = _composed()
    for legacy, replacement in LEGACY_REWARD_KEYS.items():  # both sides are keys of verl 0.9.1's composed config
        if legacy == "reward_model.reward_kwargs":  # in neither section: DAPO's scripts add it (and its new key) with +
            continue
        assert OmegaConf.select(base, legacy, default="absent") is None, legacy  # null unless set: ignored by verl
        assert OmegaConf.select(base, replacement, default="absent") != "absent", replacement
    with pytest.raises(EBPOConfigError) as err:
        check_config(_composed("reward_model.enable=True"))
    assert str(err.value) == (
        "reward_model.enable=True is verl's legacy reward key, which verl 0.9.1's trainer ignores: set "
        "reward.reward_model.enable instead"
    )
    with pytest.raises(EBPOConfigError, match=r"^reward_model.model.path='/m' .* set reward.reward_model.model_path"):
        check_config(_composed("reward_model.model.path=/m"))
    with pytest.raises(
        EBPOConfigError, match=r"^reward_model.reward_kwargs=\{'overlong.* set reward.reward_kwargs instead$"
    ):
        check_config(_composed("+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True"))
    assert check_config(_composed("reward.reward_model.enable=True")).estimator is not None  # the new key passes


@pytest.mark.parametrize(
    ("overrides", "warned"),
    [
        (("algorithm.filter_groups.enable=True",), "ebpo"),
        (("algorithm.filter_groups.enable=True", "algorithm.adv_estimator=spo"), "spo"),
        (("algorithm.filter_groups.enable=True", "algorithm.adv_estimator=grpo"), None),  # verl's: no state
        (("algorithm.filter_groups.enable=True", "algorithm.adv_estimator=bnpo"), None),  # ours, stateless
        ((), None),
    ],
)
def test_preflight_warns_once_that_filtered_groups_never_reach_a_stateful_estimator(capsys, _composed, overrides,
                                                                                     warned):  # fmt: skip
    from ebpo_verl.trainer.preflight import preflight

    config = _composed("actor_rollout_ref.model.path=Qwen/Qwen3-8B", *overrides)
    preflight(config, dry_run=True)
    lines = [line for line in capsys.readouterr().err.splitlines() if "filter_groups" in line]
    expected = (
        f"ebpo-train: warning: algorithm.filter_groups.enable=True drops every all-pass and all-fail group before the "
        f"advantage step: the {warned} estimator's running state never sees them, only the mixed groups "
        "(docs/estimator.md)"
    )
    assert lines == ([expected] if warned else [])


def test_preflight_warns_once_about_ignored_options(capsys, _composed):
    from ebpo_verl.trainer.preflight import preflight

    model = "actor_rollout_ref.model.path=Qwen/Qwen3-8B"  # a hub id: the pre-flight does not look it up
    config = _composed("algorithm.ebpo.stats_scope=batch", "algorithm.ebpo.decay=0.9", model)
    preflight(config, dry_run=True)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "warning" in line]
    assert lines == [
        "ebpo-train: warning: algorithm.ebpo option(s) decay=0.9 have no effect with stats_scope=batch, "
        "prior=gaussian, shrinkage=auto, norm=batch, cluster_key=null"
    ]
    preflight(_composed(model), dry_run=True)
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("missing", [None, float("nan"), np.float64("nan"), pd.NA])
def test_nan_labels_are_missing_in_the_data_check_and_the_rollout_rows(missing):
    from ebpo_verl.ops.errors import EBPOConfigError
    from ebpo_verl.trainer.preflight.data import check_row_labels
    from ebpo_verl.trainer.ray_trainer import extra_info_values

    infos = [{"topic": "a"}, {"topic": missing}, {"topic": "b"}]
    with pytest.raises(EBPOConfigError, match=r"missing or null in 1 of 3 training rows.*first rows: \[1\]"):
        check_row_labels(infos, "topic", "test", registry.get("ebpo"))
    with pytest.raises(EBPOConfigError, match=r"uid u1 has no extra_info\['topic'\]"):
        extra_info_values(infos, ["u0", "u1", "u2"], [False] * 3, "topic", "algorithm.ebpo.cluster_key")


def test_registered_ebpo_warns_once_per_process_about_ignored_options(monkeypatch):
    """Stock main_ppo: named once per process (per distinct options); ebpo-train (the trainer's own estimator
    object): never, as its driver's pre-flight named them."""
    import warnings

    from ebpo_verl.algos.registry import get
    from ebpo_verl.trainer.adapter import outcome_advantages

    EBPO = get("ebpo")

    monkeypatch.setattr("ebpo_verl.trainer.run_options._LAST", {})  # a fresh process (plain verl main_ppo)
    fn = get_adv_estimator_fn("ebpo")
    config = OmegaConf.create({"ebpo": {"stats_scope": "batch", "decay": 0.5}})
    rewards, mask = torch.tensor([[1.0], [0.0], [1.0], [1.0]]), torch.ones(4, 1)
    uids = np.array(["a", "a", "b", "b"], dtype=object)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            fn(token_level_rewards=rewards, response_mask=mask, index=uids, config=config)
    named = [str(w.message) for w in caught if "have no effect" in str(w.message)]
    assert named == [
        "EBPO: algorithm.ebpo option(s) decay=0.5 have no effect with stats_scope=batch, "
        "prior=gaussian, shrinkage=auto, norm=batch, cluster_key=null"
    ]
    monkeypatch.setattr("ebpo_verl.trainer.run_options._LAST", {})
    options = EBPO.parse(config.ebpo)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome_advantages(registry.new_estimator("ebpo", options), rewards, mask, uids)
    assert not [w for w in caught if "have no effect" in str(w.message)]


def test_advantage_beyond_the_output_dtype_is_an_overflow_error_not_inf():
    # float16 scores: group mean 20000, so the -60000 row's advantage is -80000 > float16's max 65504
    scores = torch.tensor([60000.0, 60000.0, -60000.0], dtype=torch.float16)
    state = EBPOState()
    options = EBPOOptions(shrinkage=0.0, norm="none")
    uids = np.array(["big"] * 3, dtype=object)
    with pytest.raises(ValueError, match=r"estimator call 1 .*overflow \(advantages above the torch.float16 maximum"):
        compute_ebpo_advantages(Batch(scores, uids, torch.ones(3, dtype=torch.bool)), options, state)
    assert state.steps == 0
    ok = compute_ebpo_advantages(Batch(scores.double(), uids, torch.ones(3, dtype=torch.bool)), options, state).values
    np.testing.assert_array_equal(ok.numpy(), [40000.0, 40000.0, -80000.0])


# ------------------------------------------- rows verl drops, pads and reorders before ebpo-train's advantage step


def dapo_rows(rng: np.random.Generator, step: int, keep: int, n: int = 4, world: int = 8) -> dict:
    """The rows verl 0.9.1 hands the advantage step under dynamic sampling (``algorithm.filter_groups``) and padding:
    groups of ``n`` whose rewards are all equal (all-pass, all-fail) are evicted and further prompts' groups drawn
    until ``keep`` mixed groups are kept; then ``pad*`` rows (verl's ``upsample_batch_to_divisible_size``: an
    all-zero response mask, the first row's ``extra_info``, tagged ``is_padding``) up to a multiple of ``world``;
    then the rows reordered (``_balance_batch``). Returns the kept rows in group order and that permutation."""
    uids, rewards, infos, dropped, pid = [], [], [], [], 0
    while len(uids) < keep * n:
        r = rng.binomial(1, rng.choice([0.1, 0.5, 0.9]), n).astype(np.float64)
        target = dropped if r.min() == r.max() else rewards
        if target is rewards:
            uids += [f"s{step}-q{pid}"] * n
            infos += [{"index": pid}] * n  # prompts recur across steps (SPO's trackers), each under a new uid
        target.append(r)
        pid += 1
    pad = -len(uids) % world
    order = rng.permutation(len(uids) + pad)
    return {"uids": np.array(uids, dtype=object), "rewards": np.concatenate(rewards), "infos": infos,
            "dropped": dropped, "pad": pad, "order": order}  # fmt: skip


def advantage_step_on(trainer, rows: dict) -> np.ndarray:
    """``rows`` through ebpo-train's ``_compute_advantage`` (the trainer's run estimator, ``step_row_values``
    reading the padding tags), verl's TransferQueue fetch (``copied_compute_advantage``) replaced by the DataProto it
    builds; each row's advantage in the reordered order."""
    from types import SimpleNamespace
    from unittest import mock

    from ebpo_verl.trainer.adapter import advantage_step
    from ebpo_verl.trainer.ray_trainer import step_row_values

    pad_uid = "pad" + "0f" * 16
    uids = np.concatenate([rows["uids"], np.array([pad_uid] * rows["pad"], dtype=object)])[rows["order"]]
    rewards = np.concatenate([rows["rewards"], np.zeros(rows["pad"])])[rows["order"]]
    infos = np.array(rows["infos"] + [rows["infos"][0]] * rows["pad"], dtype=object)[rows["order"]]
    padding = rows["order"] >= len(rows["uids"])
    seen = {}

    def step(trainer, batch, metrics, extra, estimator):
        data = make_dataproto(uids, rewards)
        data.batch["response_mask"][torch.from_numpy(padding)] = 0
        if "extra_info" in extra:
            data.non_tensor_batch["extra_info"] = infos
        seen["advantages"] = advantage_step(data, estimator, step_row_values(estimator, data, batch))[0]

    keys = [f"{u}_{o % 4}_0" for u, o in zip(uids, rows["order"], strict=True)]  # {uid}_{sample in group}_{index}
    batch = SimpleNamespace(keys=keys, tags=[{"is_padding": bool(p)} for p in padding])
    with mock.patch("ebpo_verl.trainer.ray_trainer.copied_compute_advantage", step):
        trainer._compute_advantage(batch, {})
    return seen["advantages"][:, 0].double().numpy()  # every real row has its first response token


def test_dropped_padded_and_reordered_rows_each_get_their_own_groups_advantage(stand_in_trainer, compose_config):
    """ebpo (history) through two steps of DAPO-filtered, padded, reordered batches: every row's advantage is the
    independent two-pass EBPO value of its own group computed over the kept groups only (the dropped all-pass and
    all-fail groups never reach the state), padding gets 0."""
    config = compose_config("algorithm.filter_groups.enable=True", "actor_rollout_ref.rollout.n=4")
    trainer = stand_in_trainer(config)
    rng = np.random.default_rng(53)
    history, everything = [], []
    for step in (1, 2):
        rows = dapo_rows(rng, step, keep=5)
        assert rows["dropped"] and rows["pad"], "the draw must drop groups and pad"
        got = advantage_step_on(trainer, rows)
        history.append((rows["uids"], rows["rewards"]))
        everything.append((np.concatenate([rows["uids"]] + [[f"d{i}"] * 4 for i in range(len(rows["dropped"]))]),
                           np.concatenate([rows["rewards"], *rows["dropped"]])))  # fmt: skip
        want = reference_advantages(*history[-1], *two_pass_prior(history))
        real = rows["order"] < len(rows["uids"])
        np.testing.assert_allclose(got[real], want[rows["order"][real]], rtol=1e-5, atol=1e-6)
        assert not got[~real].any()
        mismatched = want[np.roll(rows["order"][real], 4)]  # the same values paired with other groups' rows
        assert not np.allclose(got[real], mismatched, atol=1e-3)
    state = trainer.estimator.state
    assert (state.prompts_seen, state.responses_seen) == (10, 40)  # the kept groups only
    assert not np.allclose(two_pass_prior(history), two_pass_prior(everything))  # the dropped groups would count


@pytest.mark.parametrize("name", ["spo", "dbb", "krpo", "running_norm"])
def test_dropped_padded_and_reordered_rows_pair_with_their_groups_for_row_keyed_estimators(
    stand_in_trainer, compose_config, name
):
    """Estimators reading a per-row field through ebpo-train (prompt keys from ``extra_info``, padding rows carrying
    a copy of a real row's; krpo's sample index from the trajectory keys): the same advantages, row for row, as a
    fresh estimator fed the kept rows in group order without padding."""
    spec = registry.get(name)
    option = {"spo": "prompt_key=index", "dbb": "prompt_key=index", "running_norm": "row_key=index"}.get(name)
    overrides = [
        f"algorithm.adv_estimator={name}",
        "algorithm.filter_groups.enable=True",
        "actor_rollout_ref.rollout.n=4",
    ]
    trainer = stand_in_trainer(compose_config(*overrides, *([f"algorithm.{name}.{option}"] if option else [])))
    reference = registry.new_estimator(spec, trainer.options.estimator)
    rng = np.random.default_rng(7)
    for step in (1, 2):
        rows = dapo_rows(rng, step, keep=5)
        got = advantage_step_on(trainer, rows)
        keys = None
        if spec.row_key:
            keys = np.array([info["index"] for info in rows["infos"]], dtype=object)
        elif spec.reads_sample_index:
            keys = np.array([i % 4 for i in range(len(rows["uids"]))], dtype=object)
        scores = torch.as_tensor(rows["rewards"], dtype=torch.float32).double()
        want = reference(scores, rows["uids"], torch.ones(len(scores), dtype=torch.bool), keys).values.double().numpy()
        real = rows["order"] < len(rows["uids"])
        np.testing.assert_allclose(got[real], want[rows["order"][real]], rtol=1e-5, atol=1e-6)
        assert not got[~real].any()
