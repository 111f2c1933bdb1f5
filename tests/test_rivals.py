"""The rivals (jspo, jspo_history, ha_dw, krpo, running_norm) against plain-loop references of
../shared/RIVALS_NOTES.md and the papers: worked examples, all-correct / all-wrong groups, padding, exact resume."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage

from ebpo_verl.algos import registry
from ebpo_verl.algos.baselines import compute_js_advantages
from ebpo_verl.algos.estimator import Batch
from ebpo_verl.algos.ha_dw import HADWOptions
from ebpo_verl.algos.jspo import JSPOOptions, compute_jspo_advantages
from ebpo_verl.algos.jspo_history import JSPOHistoryOptions, decay
from ebpo_verl.algos.krpo import KRPOOptions, compute_krpo_advantages
from ebpo_verl.algos.registry import new_estimator
from ebpo_verl.algos.running_norm import RunningNormOptions
from ebpo_verl.trainer.ray_trainer import sample_indices
from tests.in_process import ebpo_train

EPS = 1e-6
REPO = Path(__file__).resolve().parents[1]


def groups_of(uids, rewards) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for k, r in zip(uids, rewards, strict=True):
        out.setdefault(str(k), []).append(float(r))
    return out


def batch(rng: np.random.Generator, sizes: list[int], kind: str = "binary", tag: str = "u"):
    """(uids, rewards) of groups of ``sizes``, rows shuffled; binary 0/1, pm1 -1/+1 or continuous rewards."""
    uids = np.array([f"{tag}{i}" for i, m in enumerate(sizes) for _ in range(m)], dtype=object)
    n = len(uids)
    r = {"binary": rng.integers(0, 2, n).astype(float), "pm1": rng.choice([-1.0, 1.0], n),
         "continuous": rng.normal(size=n)}[kind]  # fmt: skip
    perm = rng.permutation(n)
    return uids[perm], r[perm]


def call(estimator, uids, rewards, valid=None, row_values=None) -> np.ndarray:
    valid = torch.ones(len(uids), dtype=torch.bool) if valid is None else torch.as_tensor(valid)
    return estimator(torch.tensor(rewards, dtype=torch.float64), np.asarray(uids, dtype=object), valid,
                     row_values, "pad").values.numpy()  # fmt: skip


# ----------------------------------------------------------------------------------------------------------- jspo


def reference_jspo(uids, rewards, form: str) -> list[float]:
    """JSPO by a direct loop over arXiv 2511.03710's leave-one-out formula (RIVALS_NOTES), both forms."""
    groups = groups_of(uids, rewards)
    n = len(groups)
    mu = {k: sum(g) / len(g) for k, g in groups.items()}
    lam, mbar = {}, {}
    for i in groups:
        others = [k for k in groups if k != i]
        if not others:
            lam[i], mbar[i] = 0.0, mu[i]
            continue
        mbar[i] = sum(mu[k] for k in others) / len(others)
        v = sum(sum((x - mu[k]) ** 2 for x in groups[k]) / (len(groups[k]) * (len(groups[k]) - 1))
                if len(groups[k]) > 1 else 0.0 for k in others) / len(others)  # fmt: skip
        s = sum((mu[k] - mbar[i]) ** 2 for k in others) / len(others)
        if form == "paper":
            lam[i] = (n - 1) / n * v / (v + s) if v + s > EPS else 0.0
        else:
            lam[i] = v / (v + s + EPS)
    out, seen = [], {k: 0 for k in groups}
    for k, r in zip(uids, rewards, strict=True):
        k, g = str(k), groups[str(k)]
        loo = (sum(g) - r) / (len(g) - 1) if len(g) > 1 and n > 1 else mu[k]
        seen[k] += 1
        out.append(r - ((1 - lam[k]) * loo + lam[k] * mbar[k]))
    return out


@pytest.mark.parametrize("form", ["paper", "authors_code"])
@pytest.mark.parametrize("kind", ["binary", "pm1", "continuous"])
def test_jspo_matches_the_papers_formula_by_a_plain_loop(form, kind):
    rng = np.random.default_rng(hash((form, kind)) % 2**32)
    for _ in range(40):
        sizes = rng.integers(2 if form == "authors_code" else 1, 9, size=rng.integers(1, 10)).tolist()
        uids, r = batch(rng, sizes, kind)
        got = call(new_estimator("jspo", JSPOOptions(form=form)), uids, r)
        np.testing.assert_allclose(got, reference_jspo(uids, r, form), rtol=1e-9, atol=1e-9)


def test_shrinkage_js_matches_the_papers_formula_by_a_plain_loop_and_authors_code_differs():
    """compute_js_advantages (the ``shrinkage_js`` baseline) against the plain loop of the paper form, padding rows
    (valid False, or a uid starting with "pad") left out of every group and given 0; the authors' form differs."""
    rng = np.random.default_rng(7)
    differs = 0
    for t in range(200):
        uids, r = batch(rng, rng.integers(1, 9, size=rng.integers(1, 12)).tolist(), ["binary", "continuous"][t % 2])
        valid = rng.random(len(uids)) > 0.1
        uids = np.where(rng.random(len(uids)) < 0.05, "pad" + uids.astype(str), uids).astype(object)
        dtype = torch.float32 if t % 3 else torch.float64
        got = compute_js_advantages(
            Batch(torch.tensor(r, dtype=dtype), uids, torch.from_numpy(valid), pad_prefix="pad")
        )
        kept = valid & ~np.char.startswith(uids.astype(str), "pad")
        want = np.zeros(len(uids))
        if kept.any():
            want[kept] = reference_jspo(uids[kept], r[kept].astype(np.float32 if t % 3 else np.float64), "paper")
        assert got.values.dtype == dtype and not got.values[~kept].any()
        np.testing.assert_allclose(
            got.values.double().numpy(), want, rtol=1e-5 if t % 3 else 1e-9, atol=1e-6 if t % 3 else 1e-9
        )
        uids, r = batch(rng, rng.integers(2, 9, size=rng.integers(2, 12)).tolist())
        scores, valid = torch.tensor(r), torch.ones(len(uids), dtype=torch.bool)
        js = compute_js_advantages(Batch(scores, uids, valid)).values
        authors = compute_jspo_advantages(Batch(scores, uids, valid), JSPOOptions(form="authors_code")).values
        differs += not torch.allclose(authors, js)
    assert differs > 20  # the check can see the (n-1)/n factor


def test_jspo_edge_cases_all_correct_all_wrong_one_prompt_lone_response():
    est = new_estimator("jspo", JSPOOptions())
    uids = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    r = [1.0] * 4 + [0.0] * 4 + [1.0, 0.0, 0.0, 0.0]
    got = call(est, uids, r)
    # all-correct group a: lambda_a (r - mbar_a), not 0; by hand: others b (mean 0, w 0), c (mean 1/4, w 1/16)
    v, s = (0 + 0.25 * 0.75 * 4 / 3 / 4) / 2, ((0 - 0.125) ** 2 + (0.25 - 0.125) ** 2) / 2
    lam = 2 / 3 * v / (v + s)
    np.testing.assert_allclose(got[:4], lam * (1 - 0.125), rtol=1e-12)
    assert np.all(got[:4] > 0) and np.all(got[4:8] < 0)  # all-wrong group b is pushed down, not zero
    np.testing.assert_allclose(call(est, ["a"] * 3, [1.0, 0.0, 0.0]), [2 / 3, -1 / 3, -1 / 3])  # n = 1: RLOO
    with pytest.raises(ValueError, match=r"authors_code needs at least 2 responses.*\['b'\]"):
        call(new_estimator("jspo", JSPOOptions(form="authors_code")), ["a", "a", "b"], [1.0, 0.0, 1.0])


# --------------------------------------------------------------------------------------------------- jspo_history


def test_jspo_history_weights_are_the_authors_schedule():
    assert decay(1, 0.99) == 1.0
    w = math.sqrt(0.99)
    for t, approx in ((10, 0.40), (100, 0.92), (1000, 0.992)):
        assert decay(t, 0.99) == pytest.approx(w ** (1642.65 / (t - 1)))
        assert decay(t, 0.99) == pytest.approx(approx, abs=0.006)
    assert decay(5, 1.0 - 1e-12) == pytest.approx(0.999 ** (1642.65 / 4))  # w capped at 0.999
    assert decay(2, 0.0) == 0.0


def test_jspo_history_matches_a_plain_loop_over_steps():
    rng = np.random.default_rng(3)
    for c in (0.0, 0.5, 0.99):
        est = new_estimator("jspo_history", JSPOHistoryOptions(smoothing=c))
        num_lam = num_mean = den = 0.0
        for t in range(1, 13):
            uids, r = batch(rng, rng.integers(2, 7, size=rng.integers(1, 8)).tolist(), tag=f"s{t}-")
            groups = groups_of(uids, r)
            rbar_t = sum(r) / len(r)
            v_t = np.mean([np.var(g, ddof=1) / len(g) for g in groups.values()])
            s_t = np.mean([(np.mean(g) - rbar_t) ** 2 for g in groups.values()])
            a = 1.0 if t == 1 else min(math.sqrt(c), 0.999) ** (1642.65 / (t - 1))
            num_lam, num_mean, den = a * num_lam + v_t / (v_t + s_t + 1e-6), a * num_mean + rbar_t, a * den + 1
            lam, rbar = num_lam / den, num_mean / den
            want = [x - ((1 - lam) * (sum(groups[k]) - x) / (len(groups[k]) - 1) + lam * rbar)
                    for k, x in zip(uids, r, strict=True)]  # fmt: skip
            np.testing.assert_allclose(call(est, uids, r), want, rtol=1e-9, atol=1e-12)
        assert est.state.steps == 12 and est.diagnostics["jspo_history/lambda"] == pytest.approx(lam)


def test_jspo_history_all_correct_all_wrong_and_lone_response():
    est = new_estimator("jspo_history", JSPOHistoryOptions())
    np.testing.assert_array_equal(call(est, ["a"] * 4 + ["b"] * 4, [1.0] * 4 + [0.0] * 4), 0.0)  # v = 0: lam = 0
    got = call(est, ["a"] * 4 + ["b"] * 4, [1.0] * 4 + [1.0, 0.0, 0.0, 0.0])
    lam = est.diagnostics["jspo_history/lambda"]
    assert lam > 0 and np.allclose(got[:4], lam * (1 - est.diagnostics["jspo_history/mean"]))  # not zero
    with pytest.raises(ValueError, match=r"jspo_history needs at least 2 responses.*\['b'\]"):
        call(est, ["a", "a", "b"], [1.0, 0.0, 1.0])


# ---------------------------------------------------------------------------------------------------------- ha_dw


def reference_ha_dw(steps, opts: HADWOptions) -> list[list[float]]:
    """HA-DW by plain loops (arXiv 2601.08521 Sec. 3 and the module's documented choices), over several steps."""
    anchor, history, out = None, [], []
    for t, (uids, r) in enumerate(steps, start=1):
        x = [(v + 1) / 2 for v in r] if min(r) < 0 else list(r)
        y = sum(x) / len(x)
        prior = anchor if anchor is not None else (opts.anchor_init if opts.anchor_init is not None else y)
        gx, gr = groups_of(uids, x), groups_of(uids, r)
        adv = []
        for k, v in zip(uids, r, strict=True):
            g = gr[k]
            std = float(np.std(g, ddof=1)) if len(g) > 1 else 0.0
            a_hat = (v - np.mean(g)) / (std + opts.epsilon)
            diff = np.mean(gx[k]) - prior
            adv.append(a_hat * opts.lam_scale * math.exp(-np.sign(a_hat) * np.sign(diff) * abs(diff)))
        out.append(adv)
        if opts.update == "hard":
            eta = 1 / opts.hard_horizon
        elif t <= opts.window:
            eta = 1 / t
        else:
            eta = min(1.0, opts.eta * float(np.std(history)))
        anchor = (1 - eta) * prior + eta * y
        history = (history + [anchor])[-opts.window :]
    return out


@pytest.mark.parametrize(
    "opts",
    [HADWOptions(), HADWOptions(window=3, eta=1.7), HADWOptions(update="hard", anchor_init=0.2, lam_scale=1.0)],
    ids=["default", "short_window", "hard"],
)
def test_ha_dw_anchor_recursion_matches_a_plain_loop(opts):
    rng = np.random.default_rng(11)
    steps = []
    for t in range(15):
        uids, r = batch(rng, [8] * int(rng.integers(2, 6)), "pm1" if t % 4 == 3 else "binary", tag=f"s{t}-")
        if t % 5 == 0:
            r = np.where(rng.random(len(r)) < 0.8, 1.0, 0.0) if t % 4 != 3 else r  # an easy batch moves the anchor
        steps.append((uids, r))
    est = new_estimator("ha_dw", opts)
    for (uids, r), want in zip(steps, reference_ha_dw(steps, opts), strict=True):
        np.testing.assert_allclose(call(est, uids, r), want, rtol=1e-9, atol=1e-12)
    assert est.state.steps == 15 and len(est.state.history) == min(15, opts.window)


def test_ha_dw_weights_by_difficulty_and_keeps_uniform_groups_zero():
    est = new_estimator("ha_dw", HADWOptions(anchor_init=0.5))
    uids = ["hard"] * 4 + ["easy"] * 4 + ["right"] * 4 + ["wrong"] * 4
    r = [1.0, 0.0, 0.0, 0.0] + [1.0, 1.0, 1.0, 0.0] + [1.0] * 4 + [0.0] * 4
    got = call(est, uids, r)
    a_hat = 0.75 / (0.5 + EPS)  # |A_hat| of the lone right / wrong answer (std 0.5 of a 1-of-4 group)
    np.testing.assert_allclose(got[0], a_hat * 1.3 * math.exp(0.25), rtol=1e-12)  # hard: right answer weighted up
    np.testing.assert_allclose(got[7], -a_hat * 1.3 * math.exp(0.25), rtol=1e-12)  # easy: wrong answer weighted up
    np.testing.assert_allclose(got[1], -a_hat / 3 * 1.3 * math.exp(-0.25), rtol=1e-12)  # hard: wrong ones down
    np.testing.assert_array_equal(got[8:], 0.0)
    assert est.state.anchor == pytest.approx(0.5)  # warm-up step 1: the batch's pass rate (8 of 16)


@pytest.mark.parametrize("rewards", [[0.0, 2.0, 1.0, 0.0], [-1.0, 0.0, 1.0, 1.0]])
def test_ha_dw_refuses_rewards_that_are_not_pass_rates(rewards):
    with pytest.raises(ValueError, match=r"^ha_dw's anchor is a success rate.*\['a'\]"):
        call(new_estimator("ha_dw", HADWOptions()), ["a"] * 4, rewards)


def reference_ha_dw_authors(steps) -> list[list[float]]:
    """The authors' code's HA-DW by plain loops (../shared/RIVALS_NOTES.md): a deque of the last 10 batch-mean
    rewards, the current one included; scale 1.5 exp(-sign(mu_g - mu_hist) sign(r - mu_g) |mu_g - mu_hist|) times
    GRPO's (r - mu_g) / (std_g + 1e-6); a lone response has mu_g = 0, std_g = 1 (verl's GRPO)."""
    window, out = deque(maxlen=10), []
    for uids, r in steps:
        window.append(sum(r) / len(r))
        mu_hist = sum(window) / len(window)
        groups, adv = groups_of(uids, r), []
        for k, v in zip(uids, r, strict=True):
            g = groups[k]
            mu, std = (float(np.mean(g)), float(np.std(g, ddof=1))) if len(g) > 1 else (0.0, 1.0)
            d = mu - mu_hist
            adv.append(1.5 * math.exp(-np.sign(d) * np.sign(v - mu) * abs(d)) * (v - mu) / (std + EPS))
        out.append(adv)
    return out


def authors_steps(seed: int, count: int):
    """``count`` steps of groups of varying size and success (a lone response, all-right / all-wrong groups; an
    easy and a hard stretch move the mean), with 0/1, -1/+1 and continuous rewards."""
    rng = np.random.default_rng(seed)
    steps = []
    for t in range(count):
        sizes = [int(m) for m in rng.integers(1, 9, int(rng.integers(2, 6)))]
        uids, r = batch(rng, sizes, ("binary", "binary", "pm1", "continuous")[t % 4], tag=f"s{t}-")
        if t in (3, 4, 5):
            r = np.where(rng.random(len(r)) < 0.9, 1.0, 0.0)  # an easy stretch
        elif t in (12, 13):
            r = np.where(rng.random(len(r)) < 0.1, 1.0, 0.0)  # a hard one
        steps.append((uids, r))
    return steps


def test_ha_dw_authors_code_matches_a_plain_loop_past_a_full_window():
    steps = authors_steps(5, 16)
    assert any(min(np.unique(u, return_counts=True)[1]) == 1 for u, _ in steps)  # lone responses occur
    est = new_estimator("ha_dw", HADWOptions(form="authors_code"))
    for t, ((uids, r), want) in enumerate(zip(steps, reference_ha_dw_authors(steps), strict=True), start=1):
        np.testing.assert_allclose(call(est, uids, r), want, rtol=1e-9, atol=1e-12)
        assert len(est.state.batch_means) == min(t, 10) and est.state.steps == t
    assert est.state.anchor is None and est.state.history == []  # the paper's anchor is not read or kept


def test_ha_dw_authors_code_worked_example():
    est = new_estimator("ha_dw", HADWOptions(form="authors_code"))
    call(est, ["a"] * 4, [1.0, 1.0, 1.0, 1.0])  # batch mean 1
    got = call(est, ["h"] * 4 + ["e"] * 4, [1.0, 0.0, 0.0, 0.0] + [1.0, 1.0, 1.0, 0.0])  # batch mean 0.5
    m, a_hat = 0.75, 0.75 / (0.5 + EPS)  # mu_hist: mean of (1, 0.5); |A_hat| of the lone right / wrong answer
    np.testing.assert_allclose(got[0], a_hat * 1.5 * math.exp(m - 0.25), rtol=1e-12)  # hard (0.25): right up
    np.testing.assert_allclose(got[1], -a_hat / 3 * 1.5 * math.exp(0.25 - m), rtol=1e-12)  # hard: wrong down
    np.testing.assert_allclose(got[7], -a_hat * 1.5, rtol=1e-12)  # mu_g = mu_hist: sign 0, the bare 1.5
    assert est.state.batch_means == [1.0, 0.5]


def test_ha_dw_authors_code_window_resumes_mid_window_and_is_saved_only_when_used():
    steps = authors_steps(6, 15)
    whole, first = (new_estimator("ha_dw", HADWOptions(form="authors_code")) for _ in range(2))
    for uids, r in steps[:6]:
        call(whole, uids, r)
        call(first, uids, r)
    saved = json.loads(json.dumps(first.state.state_dict()))
    assert len(saved["batch_means"]) == 6
    resumed, fresh = (new_estimator("ha_dw", HADWOptions(form="authors_code")) for _ in range(2))
    resumed.state.load_state_dict(saved)
    for uids, r in steps[6:]:  # past the 10th step: the restored means leave the window in order
        want = call(whole, uids, r)
        np.testing.assert_array_equal(call(resumed, uids, r), want)
        assert not np.array_equal(call(fresh, uids, r), want)  # an empty window (the authors' resume) differs
    assert resumed.state.state_dict() == whole.state.state_dict()
    paper = new_estimator("ha_dw", HADWOptions())
    call(paper, *steps[0])
    assert "batch_means" not in paper.state.state_dict()  # the paper form's snapshot keeps its old fields


def test_ha_dw_loads_a_snapshot_from_before_the_window_and_refuses_a_bad_window():
    old = {"version": 1, "steps": 3, "anchor": 0.25, "history": [0.5, 0.375, 0.25]}  # as every older checkpoint
    est = new_estimator("ha_dw", HADWOptions())
    est.state.load_state_dict(old)
    assert est.state.state_dict() == old and est.state.batch_means == []
    for bad in ([0.5] * 11, [float("nan")], "0.5", [], None):  # [] is never written: a snapshot restores exactly
        with pytest.raises(ValueError, match=r"^ha_dw state: batch_means.* (must have 1 to 10|must be a)"):
            est.state.load_state_dict({**old, "batch_means": bad})
        assert est.state.state_dict() == old


def test_ha_dw_authors_code_takes_raw_rewards():
    est = new_estimator("ha_dw", HADWOptions(form="authors_code"))
    got = call(est, ["a"] * 4, [0.0, 2.0, 1.0, 0.0])  # refused by the paper form (its anchor is a success rate)
    mu, std = 0.75, float(np.std([0.0, 2.0, 1.0, 0.0], ddof=1))
    np.testing.assert_allclose(got, 1.5 * (np.array([0.0, 2.0, 1.0, 0.0]) - mu) / (std + EPS), rtol=1e-12)
    spec = registry.get("ha_dw")
    assert spec.pass_rates(HADWOptions()) and spec.pass_rates(HADWOptions(form="authors_code")) is None


# ----------------------------------------------------------------------------------------------------------- krpo


def reference_krpo(rewards: list[float], q=1e-5, r_noise=1e-2, x=0.0, p=1.0) -> list[float]:
    out = []
    for r in rewards:
        prior = p + q
        k = prior / (prior + r_noise)
        x = x + k * (r - x)
        p = (1 - k) * prior
        out.append((r - x) / (math.sqrt(p) + 1e-8))
    return out


def test_krpo_worked_example_and_uniform_groups():
    est = new_estimator("krpo", KRPOOptions(order="rows"))
    got = call(est, ["a"] * 8, [1, 0, 0, 1, 0, 0, 0, 0])
    want = [0.0995, -7.048, -5.751, 10.015, -8.900, -8.098, -7.468, -6.954]
    np.testing.assert_allclose(got, want, atol=0.005)
    np.testing.assert_array_equal(call(est, ["a"] * 8, [0.0] * 8), 0.0)
    correct = call(est, ["a"] * 8, [1.0] * 8)
    np.testing.assert_allclose(correct[[0, 1, 7]], [0.0995, 0.0705, 0.0347], atol=5e-4)
    assert np.all(np.diff(correct) < 0)


def test_krpo_walks_by_sample_index_whatever_the_row_order():
    rng = np.random.default_rng(5)
    sizes = [8, 5, 12, 1]
    uids = np.array([f"u{i}" for i, m in enumerate(sizes) for _ in range(m)], dtype=object)
    sample = np.array([j for m in sizes for j in range(m)], dtype=object)
    r = rng.integers(0, 2, len(uids)).astype(float)
    want = np.concatenate([reference_krpo(r[uids == f"u{i}"].tolist()) for i in range(len(sizes))])
    perm = rng.permutation(len(uids))  # as verl's length balancing reorders the rows
    got = call(new_estimator("krpo", KRPOOptions()), uids[perm], r[perm], row_values=sample[perm])
    np.testing.assert_allclose(got, want[perm], rtol=1e-12)
    by_rows = call(new_estimator("krpo", KRPOOptions(order="rows")), uids[perm], r[perm])
    assert not np.allclose(by_rows, want[perm])  # the row order gives other numbers: the order matters
    with pytest.raises(ValueError, match="order=sample_index needs each row's rollout sample index"):
        call(new_estimator("krpo", KRPOOptions()), uids, r)
    with pytest.raises(ValueError, match="same sample index"):
        call(new_estimator("krpo", KRPOOptions()), ["a", "a"], [1.0, 0.0], row_values=np.array([0, 0], dtype=object))


def test_krpo_sample_indices_from_verls_trajectory_keys():
    keys = ["3f2a-uid_0_0", "3f2a-uid_11_0", "u_with_underscores_2_1", f"pad{'ab' * 16}_4_0"]
    assert sample_indices(keys).tolist() == [0, 11, 2, 4]
    assert registry.get("krpo").reads_sample_index and registry.get("krpo").row_input == registry.SAMPLE_INDEX
    with pytest.raises(ValueError, match=r"trajectory key 'uid-7' is not verl's \{uid\}_\{session_id\}_\{index\}"):
        sample_indices(["uid-7"])


def test_krpo_options_reach_the_filter():
    opts = KRPOOptions(process_noise=1e-3, measurement_noise=0.5, x0=0.3, p0=2.0, order="rows")
    batch = Batch(torch.tensor([1.0, 0.0, 1.0]), np.array(["a"] * 3, dtype=object), torch.ones(3, dtype=torch.bool))
    got = compute_krpo_advantages(batch, opts).values
    np.testing.assert_allclose(got.numpy(), reference_krpo([1.0, 0.0, 1.0], 1e-3, 0.5, 0.3, 2.0), rtol=1e-6)


# --------------------------------------------------------------------------------------------------- running_norm


def test_running_norm_moments_over_concatenated_batches_global_and_per_key():
    rng = np.random.default_rng(9)
    for row_key in (None, "topic"):
        est = new_estimator("running_norm", RunningNormOptions(row_key=row_key))
        seen: dict[str, list[float]] = {}
        for t in range(6):
            uids, r = batch(rng, [4] * int(rng.integers(1, 6)), "continuous", tag=f"s{t}-")
            topics = rng.choice(["alg", "geo", "num"], len(uids)).astype(object)
            keys = topics if row_key else np.full(len(uids), "(all)", dtype=object)
            for k, x in zip(keys, r, strict=True):
                seen.setdefault(k, []).append(float(x))
            want = [(x - np.mean(seen[k])) / (np.std(seen[k], ddof=1) + 1e-6 if len(seen[k]) > 1 else 1e-6)
                    for k, x in zip(keys, r, strict=True)]  # fmt: skip
            np.testing.assert_allclose(call(est, uids, r, row_values=topics), want, rtol=1e-9, atol=1e-9)
        assert est.state.steps == 6 and sorted(est.state.domains) == sorted(seen)
        assert est.state.domains[sorted(seen)[0]].n == len(seen[sorted(seen)[0]])


def test_running_norm_uniform_first_batch_and_the_per_key_form_needs_row_values():
    est = new_estimator("running_norm", RunningNormOptions())
    np.testing.assert_array_equal(call(est, ["a"] * 4, [1.0] * 4), 0.0)  # all-correct: std 0, A = 0
    np.testing.assert_allclose(call(est, ["b"] * 4, [0.0] * 4), -0.5 / (math.sqrt(8 / 28) + 1e-6))  # then all-wrong
    with pytest.raises(ValueError, match=r"^adv_estimator=running_norm with algorithm.running_norm.row_key='topic'"):
        call(new_estimator("running_norm", RunningNormOptions(row_key="topic")), ["a"], [1.0])


# ------------------------------------------------------------------------------------------------- every estimator


def make(name: str):
    return {
        "jspo": lambda: new_estimator("jspo", JSPOOptions()),
        "jspo_history": lambda: new_estimator("jspo_history", JSPOHistoryOptions()),
        "ha_dw": lambda: new_estimator("ha_dw", HADWOptions()),
        "krpo": lambda: new_estimator("krpo", KRPOOptions()),
        "running_norm": lambda: new_estimator("running_norm", RunningNormOptions(row_key="topic")),
    }[name]()


NAMES = ["jspo", "jspo_history", "ha_dw", "krpo", "running_norm"]


def steps_of(seed: int, count: int):
    """``count`` steps of (uids, rewards, valid, row values): sample indices for krpo, topics for running_norm."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(count):
        uids, r = batch(rng, [4] * int(rng.integers(2, 6)), tag=f"s{t}-")
        sample = np.array([int((uids[: i + 1] == u).sum()) - 1 for i, u in enumerate(uids)], dtype=object)
        out.append((uids, r, sample, rng.choice(["alg", "geo"], len(uids)).astype(object)))
    return out


def run_step(name, est, step):
    uids, r, sample, topics = step
    return call(est, uids, r, row_values=sample if name == "krpo" else topics)


@pytest.mark.parametrize("name", NAMES)
def test_padding_rows_get_zero_and_change_nothing(name):
    uids, r, sample, topics = steps_of(1, 1)[0]
    plain, padded = make(name), make(name)
    want = run_step(name, plain, (uids, r, sample, topics))
    k = 5
    p_uids = np.concatenate([uids, np.array([f"pad{i}" for i in range(k)] + ["s0-0"] * 2, dtype=object)])
    p_r = np.concatenate([r, np.full(k + 2, 0.37)])
    valid = np.concatenate([np.ones(len(uids), bool), np.ones(k, bool), np.zeros(2, bool)])
    p_sample = np.concatenate([sample, np.array([None] * k + [0, 0], dtype=object)])
    p_topics = np.concatenate([topics, np.array([None] * k + ["zzz", "zzz"], dtype=object)])
    got = call(padded, p_uids, p_r, valid, p_sample if name == "krpo" else p_topics)
    np.testing.assert_array_equal(got[len(uids) :], 0.0)
    np.testing.assert_array_equal(got[: len(uids)], want)
    if plain.state is not None:
        assert padded.state.state_dict() == plain.state.state_dict()


@pytest.mark.parametrize("name", ["jspo_history", "ha_dw", "running_norm"])
def test_state_dict_round_trip_through_json_resumes_exactly(name):
    steps = steps_of(2, 14)
    whole, first = make(name), make(name)
    for step in steps[:9]:
        run_step(name, whole, step)
        run_step(name, first, step)
    resumed = make(name)
    resumed.state.load_state_dict(json.loads(json.dumps(first.state.state_dict())))
    assert resumed.state.state_dict() == whole.state.state_dict()
    fresh = make(name)  # a run that lost its state gives other numbers: the comparison can see the state
    for step in steps[9:]:
        want = run_step(name, whole, step)
        np.testing.assert_array_equal(run_step(name, resumed, step), want)
        assert not np.array_equal(run_step(name, fresh, step), want)
    resumed.reset()
    assert resumed.state.state_dict() == make(name).state.state_dict()


@pytest.mark.parametrize("name", ["jspo_history", "ha_dw", "running_norm"])
@pytest.mark.parametrize("bad", [[], {"version": 2}, {"version": 1, "steps": -1}])
def test_a_bad_saved_state_is_refused_and_changes_nothing(name, bad):
    est = make(name)
    run_step(name, est, steps_of(4, 1)[0])
    before = est.state.state_dict()
    with pytest.raises(ValueError, match=f"^{name} state"):
        est.state.load_state_dict(bad)
    assert est.state.state_dict() == before


@pytest.mark.parametrize(
    ("cls", "mapping", "pattern"),
    [
        (JSPOOptions, {"form": "author"}, "algorithm.jspo.form='author' is invalid; use paper or authors_code"),
        (JSPOHistoryOptions, {"smoothing": 1.0}, r"algorithm.jspo_history.smoothing=1.0 is invalid; use a float in"),
        (HADWOptions, {"lam_scale": 0}, "algorithm.ha_dw.lam_scale=0 is invalid"),
        (HADWOptions, {"window": 1}, r"algorithm.ha_dw.window=1 is invalid; use an integer in \[2, 2\*\*53\]"),
        (HADWOptions, {"anchor_init": 1.5}, "algorithm.ha_dw.anchor_init=1.5 is invalid; use null or a float in"),
        (HADWOptions, {"update": "soft"}, "algorithm.ha_dw.update='soft' is invalid; use adaptive or hard"),
        (KRPOOptions, {"measurement_noise": 0.0}, "algorithm.krpo.measurement_noise=0.0 is invalid"),
        (KRPOOptions, {"order": "index"}, "algorithm.krpo.order='index' is invalid; use sample_index or rows"),
        (RunningNormOptions, {"row_key": ""}, "algorithm.running_norm.row_key='' is invalid"),
        (RunningNormOptions, {"epsilon": -1.0}, "algorithm.running_norm.epsilon=-1.0 is invalid"),
    ],
)
def test_bad_option_values_are_refused_in_one_line(cls, mapping, pattern):
    with pytest.raises(ValueError, match=pattern) as info:
        cls.from_mapping(mapping)
    assert "\n" not in str(info.value)


def test_every_rival_is_declared_once_with_its_state_where_it_keeps_one():
    from ebpo_verl.algos import ha_dw, jspo, jspo_history, krpo, registry, running_norm

    specs = {s.name: s for m in (jspo, jspo_history, ha_dw, krpo, running_norm) for s in m.SPECS}
    assert sorted(specs) == sorted(NAMES)
    assert {n for n, s in specs.items() if s.stateful} == {"jspo_history", "ha_dw", "running_norm"}
    assert specs["running_norm"].row_key == "row_key" and not specs["running_norm"].unique_row_key
    assert all(f"ebpo_verl.algos.{n}" in registry.MODULES for n in NAMES)
    for spec in specs.values():
        assert new_estimator(spec).options == spec.options_cls() and spec.source


# ------------------------------------------------------------------------------ verl, ebpo-train, recipes, study

NEW = {"jspo": {}, "jspo_history": {}, "ha_dw": {}, "krpo": {"order": "rows"}, "running_norm": {}}
"""The five rivals and the options that let stock main_ppo's registered function run them (no per-row values)."""


def make_dataproto(uids, rewards, pad: int = 0, length: int = 5) -> DataProto:
    """Reward on the last valid token of responses of length 1..length, plus ``pad`` padding rows (uid ``pad*``,
    all-zero mask)."""
    bs = len(uids)
    lengths = np.concatenate([1 + np.arange(bs) % length, np.zeros(pad, dtype=int)])
    mask = torch.from_numpy(np.arange(length)[None, :] < lengths[:, None]).float()
    tlr = torch.zeros(bs + pad, length)
    tlr[torch.arange(bs), torch.from_numpy(lengths[:bs] - 1)] = torch.as_tensor(rewards, dtype=torch.float32)
    all_uids = np.concatenate([np.asarray(uids, dtype=object), np.array([f"pad{i}" for i in range(pad)], dtype=object)])
    return DataProto.from_dict(
        tensors={"token_level_rewards": tlr, "response_mask": mask}, non_tensors={"uid": all_uids}
    )


@pytest.mark.parametrize("name", sorted(NEW))
def test_verls_compute_advantage_runs_each_rival_with_masks_and_padding(name):
    """verl's contract: advantages (bs, L) equal to the math layer's value on every response token, 0 on masked
    tokens and on padding rows, returns = advantages; the default instance's state is this process's."""
    import ebpo_verl  # noqa: F401  (registers)
    from ebpo_verl.trainer.adapter import DEFAULT_ESTIMATORS

    uids, r = batch(np.random.default_rng(21), [4, 4, 4, 4])
    config = OmegaConf.create({name: NEW[name]})
    if name in DEFAULT_ESTIMATORS:
        DEFAULT_ESTIMATORS[name].reset()
    data = compute_advantage(make_dataproto(uids, r, pad=3), name, config=config)
    adv, mask = data.batch["advantages"], data.batch["response_mask"]
    assert adv.shape == mask.shape == (len(uids) + 3, 5)
    torch.testing.assert_close(adv, adv[:, :1] * mask)
    torch.testing.assert_close(data.batch["returns"], adv)
    assert not adv[len(uids) :].any()
    spec = registry.get(name)
    want = call(new_estimator(spec, NEW[name]), uids, r.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(adv[: len(uids), 0].numpy(), want, rtol=1e-5, atol=1e-6)
    if name in DEFAULT_ESTIMATORS:
        DEFAULT_ESTIMATORS[name].reset()


def test_stock_main_ppo_refuses_the_inputs_it_cannot_give_in_one_line():
    import ebpo_verl  # noqa: F401

    data = make_dataproto(["a", "a"], [1.0, 0.0])
    with pytest.raises(ValueError, match=r"^adv_estimator=krpo with algorithm.krpo.order=sample_index needs") as err:
        compute_advantage(data, "krpo", config=OmegaConf.create({}))
    assert "\n" not in str(err.value)
    topic = OmegaConf.create({"running_norm": {"row_key": "topic"}})
    with pytest.raises(ValueError, match=r"^adv_estimator=running_norm with algorithm.running_norm.row_key='topic'"):
        compute_advantage(make_dataproto(["a", "a"], [1.0, 0.0]), "running_norm", config=topic)


BAD_OPTIONS = {
    "jspo": ("form=author", "algorithm.jspo.form='author' is invalid; use paper or authors_code"),
    "jspo_history": ("smoothing=1.5", "algorithm.jspo_history.smoothing=1.5 is invalid; use a float in [0, 1)"),
    "ha_dw": ("lam_scale=-1", "algorithm.ha_dw.lam_scale=-1 is invalid; use a float in (0, 100]"),
    "krpo": ("order=random", "algorithm.krpo.order='random' is invalid; use sample_index or rows"),
    "running_norm": ("epsilon=0", "algorithm.running_norm.epsilon=0 is invalid; use a float > 0"),
}


@pytest.mark.parametrize("name", sorted(BAD_OPTIONS))
def test_ebpo_train_cfg_job_refuses_a_bad_value_of_each_new_option(monkeypatch, capsys, name):
    code, out, err = ebpo_train(monkeypatch, capsys, "--cfg", "job", f"algorithm.adv_estimator={name}")
    assert code == 0, err  # the defaults pass the pre-flight
    setting, message = BAD_OPTIONS[name]
    code, out, err = ebpo_train(
        monkeypatch, capsys, "--cfg", "job", f"algorithm.adv_estimator={name}", f"algorithm.{name}.{setting}"
    )
    assert code == 2 and out == ""
    [line] = [line for line in err.splitlines() if line.startswith("ebpo-train: error:")]
    assert line.startswith(f"ebpo-train: error: {message}") and "Traceback" not in err


def test_ebpo_train_refuses_shaped_rewards_for_ha_dw(monkeypatch, capsys):
    code, _, err = ebpo_train(
        monkeypatch, capsys, "--cfg", "job", "algorithm.adv_estimator=ha_dw", "algorithm.use_kl_in_reward=true"
    )
    assert code == 2 and "algorithm.adv_estimator=ha_dw needs rewards in [0, 1] or the paper's -1/+1 (its anchor" in err


# ---------------------------------------------------------------------- the trainer: resume and sample index


ROWS = [i % 6 for i in range(8 * 4)]
"""The stand-in trainer's prompt ids: 4 prompts per step, recurring."""


def _trainer_step(trainer, step: int) -> torch.Tensor:
    """One advantage step of the run's estimator as the trainer runs it (per-row topics from extra_info)."""
    from ebpo_verl.trainer.adapter import advantage_step
    from ebpo_verl.trainer.ray_trainer import extra_info_values

    prompt_ids = next(trainer._data_iter).tolist()
    rewards, uids, infos = [], [], []
    for pid in prompt_ids:
        gen = torch.Generator().manual_seed(1000 * step + pid)
        rewards += (torch.rand(3, generator=gen) < (pid + 1) / 7).float().tolist()
        uids += [f"fresh-{step}-{pid}"] * 3
        infos += [{"index": pid, "topic": f"t{pid % 2}"}] * 3
    data = make_dataproto(np.array(uids, dtype=object), rewards, pad=1)
    key = trainer.options.row_key
    rows = [False] * len(uids) + [True]  # make_dataproto's padding row
    keys = extra_info_values([*infos, infos[0]], [*uids, "pad0"], rows, key, "row key") if key else None
    data.batch["advantages"], data.batch["returns"], _ = advantage_step(data, trainer.estimator, keys)
    return data.batch["advantages"].clone()


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("jspo_history", ()),
        ("ha_dw", ("algorithm.ha_dw.window=2",)),
        ("ha_dw", ("algorithm.ha_dw.form=authors_code",)),  # its window of batch means (the authors' code drops it)
        ("running_norm", ("algorithm.running_norm.row_key=topic",)),
    ],  # fmt: skip
)
def test_each_stateful_rival_resumes_exactly_through_the_trainers_checkpoint(
    tmp_path, stand_in_trainer, compose_config, name, overrides
):
    """verl's v1 sync trainer (stand-in workers): save at step 3, a new trainer loads it and continues; every step's
    advantages equal the uninterrupted run's, and a lost state would have changed them."""
    spec = registry.get(name)
    config = compose_config(f"algorithm.adv_estimator={name}", "actor_rollout_ref.rollout.n=3",
                            f"trainer.default_local_dir={tmp_path / 'ckpt'}", *overrides)  # fmt: skip
    uninterrupted = stand_in_trainer.run(stand_in_trainer(config, ROWS, 4), range(1, 8), _trainer_step)
    first = stand_in_trainer(config, ROWS, 4)
    before = stand_in_trainer.run(first, range(1, 4), _trainer_step)
    first.global_steps = 3
    first._save_checkpoint()
    saved = json.loads((tmp_path / "ckpt" / "global_step_3" / spec.state.file).read_text())
    assert saved["state"] == first.estimator.state.state_dict() and saved["state"]["steps"] == 3
    resumed = stand_in_trainer(config, ROWS, 4)
    stand_in_trainer.run(resumed, range(90, 92), _trainer_step)  # other state before the load
    resumed._load_checkpoint()
    assert resumed.global_steps == 3 and resumed.estimator.state.state_dict() == saved["state"]
    resumed._data_iter = iter(resumed.train_dataloader)
    after = stand_in_trainer.run(resumed, range(4, 8), _trainer_step)
    for a, b in zip(before + after, uninterrupted, strict=True):
        assert torch.equal(a, b)
    fresh = stand_in_trainer(config, ROWS[12:], 4)  # the same steps 4..7 from an empty state
    lost = stand_in_trainer.run(fresh, range(4, 8), _trainer_step)
    assert any(not torch.equal(a, b) for a, b in zip(lost, after, strict=True))


def test_the_trainer_walks_krpo_in_the_rollouts_order_read_from_verls_keys(
    stand_in_trainer, compose_config, monkeypatch
):
    """After verl's length balancing the rows of a uid are out of order; the trainer reads each row's sample index
    from its trajectory key ``{uid}_{session_id}_{index}`` and KRPO walks the group in that order."""
    from types import SimpleNamespace

    from ebpo_verl.trainer.adapter import advantage_step
    from ebpo_verl.trainer.ray_trainer import step_row_values

    trainer = stand_in_trainer(compose_config("algorithm.adv_estimator=krpo"))
    r = np.array([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    uids = np.array(["u-a"] * 4 + ["u-b"] * 4, dtype=object)
    keys = [f"{u}_{j % 4}_0" for j, u in enumerate(uids)]
    perm = np.array([5, 2, 7, 0, 3, 6, 1, 4])  # as _balance_batch reorders
    seen = {}

    def step(trainer, batch, metrics, extra, estimator):
        data = make_dataproto(uids[perm], r[perm])
        seen["adv"] = advantage_step(data, estimator, step_row_values(estimator, data, batch))[0][:, 0].numpy()

    monkeypatch.setattr("ebpo_verl.trainer.ray_trainer.copied_compute_advantage", step)
    trainer._compute_advantage(SimpleNamespace(keys=[keys[i] for i in perm]), {})
    want = np.concatenate([reference_krpo(r[:4].tolist()), reference_krpo(r[4:].tolist())])
    np.testing.assert_allclose(seen["adv"], want[perm], rtol=1e-6)


# ------------------------------------------------------------------------------------------- recipes, study


def test_the_rivals_table_runs_every_rival_at_equal_samples():
    from ebpo_verl.recipes import driver
    from ebpo_verl.recipes.presets import PRESETS
    from ebpo_verl.recipes.tables import TABLES

    runs = driver.experiments(TABLES["rivals"], {"WORK_DIR": "/w"}, [])
    assert len(runs) == len({e.name for e in runs}) == 36
    for e in runs:
        batch_size = e.spec.train_batch or 512
        assert batch_size * e.spec.group_size == 2048 and e.spec.model.tag == "qwen3_8b"
        last = [o for o in e.spec.overrides() if o.startswith("data.train_batch_size=")][-1]  # Hydra: the last wins
        assert last == f"data.train_batch_size={batch_size}"
    assert {e.spec.algo for e in runs} >= set(NEW) and {e.spec.group_size for e in runs} == {2, 4, 8}
    for name in NEW:
        settings = PRESETS[name].settings("paper")
        assert settings[0].override == f"algorithm.adv_estimator={name}" and all(s.source for s in settings)
    main_g4 = {e.name for e in driver.experiments(TABLES["main"], {"V2_ROWS": "1", "WORK_DIR": "/w"}, [])}
    assert {e.name for e in runs if e.spec.group_size == 4 and e.spec.algo in NEW} <= main_g4  # shared runs
    with pytest.raises(ValueError, match="TRAIN_BATCH is set per row by the table drivers"):
        driver.experiments(TABLES["rivals"], {"WORK_DIR": "/w", "TRAIN_BATCH": "64"}, [])


def test_the_rivals_table_lists_its_runs_from_the_command_line(tmp_path):
    env = {**os.environ, "WORK_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "ebpo_verl.recipes", "table", "rivals", "--list"], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 37 and "qwen3_8b-krpo-g2-random-b1024-rw_paper-bl_paper" in done.stdout


@pytest.mark.slow
def test_each_rival_run_passes_the_dry_runs_preflight(tmp_path):
    """DRY_RUN=1 of one run per new preset (G = 2 with 1024 prompts: the table's batch switch too) exits 0 with
    the pre-flight's ok (composition, our checks, verl's validate_config at 4 x 8 GPUs)."""
    for name in NEW:
        env = {**os.environ, "WORK_DIR": str(tmp_path), "PYTHONPATH": str(REPO), "DRY_RUN": "1", "ALGO": name,
               "GROUP_SIZE": "2", "TRAIN_BATCH": "1024", "ORDER": "random"}  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "ebpo_verl.recipes", "run", "qwen3_8b"], env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, (name, done.stderr[-3000:])
        assert "pre-flight: ok" in done.stderr + done.stdout, name
        assert "data.train_batch_size: 1024" in done.stdout or "train_batch_size: 1024" in done.stdout, name


def test_the_studys_rivals_preset_holds_every_estimator_at_three_group_sizes():
    from ebpo_verl.study.presets import PRESETS
    from ebpo_verl.study.rl import ESTIMATORS

    p = PRESETS["rivals"]
    want = {"grpo", "rloo", "otb", "ebpo", "spo", "dbb", "jspo", "bnpo", *NEW}
    assert set(p.estimators) == want and p.group_sizes == (2, 4, 8) and p.seeds >= 6
    assert p.tune and set(p.lr_grid) == want  # each at the rate it chose on the validation split
    p.check_lrs()
    assert p.n_runs() == len(want) * 3 * p.seeds + len(want) * len(p.lr_grid["grpo"]) * p.tune["seeds"]
    assert ESTIMATORS["krpo"].overrides == {}  # the study passes each row's place in its group: the sample order
