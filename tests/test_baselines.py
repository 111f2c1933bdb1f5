"""shrinkage_js, bnpo and spo against plain loops of docs/paper_notes.md#fork-baselines; SPO resume; registration."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.ray_trainer import compute_advantage

from ebpo_verl.algos.baselines import (
    SPOOptions,
    SPOState,
    compute_bnpo_advantages,
    compute_js_advantages,
    compute_spo_advantages,
)
from ebpo_verl.algos.estimator import Advantages, Batch
from ebpo_verl.algos.registry import get
from ebpo_verl.ops.errors import EBPOConfigError
from ebpo_verl.trainer.adapter import DEFAULT_ESTIMATORS, advantage_step
from ebpo_verl.trainer.checkpoint.state import load_state
from ebpo_verl.trainer.preflight import check_config
from ebpo_verl.trainer.preflight.data import check_prompt_keys
from ebpo_verl.trainer.ray_trainer import ebpo_trainer_cls, extra_info_values

SPO = get("spo")

EPS = 1e-6
REPO = Path(__file__).resolve().parents[1]
DEFAULT_SPO = DEFAULT_ESTIMATORS["spo"]
"""The process's default ``spo`` instance: what verl's registry (stock ``main_ppo``, the CPU study) runs."""


@pytest.fixture(autouse=True)
def _fresh_default_spo():
    DEFAULT_SPO.reset()
    yield
    DEFAULT_SPO.reset()


# ------------------------------------------------ plain-loop references, following docs/paper_notes.md#fork-baselines


def groups_of(keys, rewards) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for k, r in zip(keys, rewards, strict=True):
        out.setdefault(str(k), []).append(float(r))
    return out


def reference_js(uids, rewards) -> list[float]:
    groups = groups_of(uids, rewards)
    n = len(groups)
    mu = {k: sum(g) / len(g) for k, g in groups.items()}
    w = {}
    for k, g in groups.items():
        m = len(g)
        w[k] = sum((x - mu[k]) ** 2 for x in g) / (m - 1) / m if m > 1 else 0.0
    lam, mbar = {}, {}
    for i in groups:
        others = [k for k in groups if k != i]
        if not others:
            lam[i], mbar[i] = 0.0, 0.0
            continue
        mbar[i] = sum(mu[k] for k in others) / (n - 1)
        s = max((sum(mu[k] ** 2 for k in others) - (n - 1) * mbar[i] ** 2) / (n - 1), 0.0)
        v = sum(w[k] for k in others) / (n - 1)
        lam[i] = ((n - 1) / n) * v / (v + s) if v + s > EPS else 0.0
    out = []
    for k, r in zip(uids, rewards, strict=True):
        g = groups[str(k)]
        m = len(g)
        own = (sum(g) - r) / (m - 1) if n > 1 and m > 1 else mu[str(k)]
        out.append(r - ((1 - lam[str(k)]) * own + lam[str(k)] * mbar[str(k)]))
    return out


def reference_bnpo(uids, rewards) -> list[float]:
    """The #fork-baselines formula on pass rates; the paper's -1/+1 reward: pass = (r + 1)/2 per response and the
    advantage is the reward minus its expected value 2 p - 1 over the pdf (reward units)."""
    if not all(0 <= r <= 1 for r in rewards):
        assert all(r in (-1.0, 1.0) for r in rewards)
        passes = [(r + 1) / 2 for r in rewards]
        groups = groups_of(uids, passes)
        p = {k: sum(g) / len(g) for k, g in groups.items()}
        pass_adv = reference_bnpo(uids, passes)
        pdf = [(x - p[str(k)]) / a if a else None for k, x, a in zip(uids, passes, pass_adv, strict=True)]
        return [0.0 if d is None else (r - (2 * p[str(k)] - 1)) / d for k, r, d in zip(uids, rewards, pdf, strict=True)]
    groups = groups_of(uids, rewards)
    p = {k: sum(g) / len(g) for k, g in groups.items()}
    vals = list(p.values())
    n = len(vals)
    mean = sum(vals) / n
    var = sum((x - mean) ** 2 for x in vals) / (n - 1) if n > 1 else 0.0
    m = min(max(mean, EPS), 1 - EPS)
    a = b = 0.0
    if EPS < var < m * (1 - m):
        nu = m * (1 - m) / var - 1
        a, b = nu * m, nu * (1 - m)
    alpha, beta = 1 + a / 3, 1 + b / 3
    log_norm = math.lgamma(alpha) + math.lgamma(beta) - math.lgamma(alpha + beta)  # large nu overflows gamma()
    out = []
    for k, r in zip(uids, rewards, strict=True):
        q = min(max(p[str(k)], EPS), 1 - EPS)
        pdf = math.exp((alpha - 1) * math.log(q) + (beta - 1) * math.log(1 - q) - log_norm)
        out.append((r - p[str(k)]) / max(EPS, pdf))
    return out


class ReferenceSPO:
    """A dict of (alpha, beta) per prompt key; baseline 0.5 while unseen; first update from (4, 4)."""

    def __init__(self, rho: float = 0.9, n0: float = 8.0):
        self.rho, self.n0, self.tracker = rho, n0, {}

    def step(self, keys, rewards) -> list[float]:
        base = {}
        for k in map(str, keys):
            a, b = self.tracker.get(k, (None, None))
            base[k] = 0.5 if a is None else a / (a + b)
        adv = [r - base[str(k)] for k, r in zip(keys, rewards, strict=True)]
        mean = sum(adv) / len(adv)
        std = math.sqrt(sum((x - mean) ** 2 for x in adv) / (len(adv) - 1)) if len(adv) > 1 else 0.0
        for k, g in groups_of(keys, rewards).items():
            rbar = min(max(sum(g) / len(g), 0.0), 1.0)
            a, b = self.tracker.get(k, (self.n0 / 2, self.n0 / 2))
            self.tracker[k] = (self.rho * a + rbar, self.rho * b + (1 - rbar))
        return [(x - mean) / (std + EPS) for x in adv]


# ------------------------------------------------------------------------------------------------ batches


def make_batch(rng: np.random.Generator, sizes: list[int], kind: str = "binary", tag: str = "s"):
    """Groups of the given sizes in a shuffled row order; rewards binary, +-1 or continuous."""
    uids = np.concatenate([[f"{tag}-q{i}"] * n for i, n in enumerate(sizes)]).astype(object)
    p = rng.uniform(0, 1, len(sizes))
    r = np.concatenate([rng.binomial(1, p[i], n) for i, n in enumerate(sizes)]).astype(np.float64)
    if kind == "pm1":
        r = 2 * r - 1
    elif kind == "continuous":
        r = np.round(rng.normal(0.3, 1.0, len(r)), 4)
    perm = rng.permutation(len(uids))
    return uids[perm], r[perm]


def run(fn, uids, rewards, valid=None) -> np.ndarray:
    valid = torch.ones(len(uids), dtype=torch.bool) if valid is None else valid
    return fn(Batch(torch.as_tensor(rewards, dtype=torch.float64), uids, valid)).values.numpy()


def spo_step(scores: torch.Tensor, keys: np.ndarray, valid: torch.Tensor, state: SPOState) -> Advantages:
    """One ``spo`` step with the default options on rows keyed by ``keys`` (the stable prompt keys, also the uids)."""
    return compute_spo_advantages(Batch(scores, keys, valid, keys), SPOOptions(), state)


EDGE_CASES = {
    "one-prompt": ([5], None),
    "groups-of-one": ([1, 1, 1, 1], None),
    "mixed-with-ones": ([1, 4, 1, 3], None),
    "all-equal": ([4, 4, 4], np.ones(12)),
    "all-zero": ([3, 2], np.zeros(5)),
    "single-response": ([1], None),
}


@pytest.mark.parametrize("case", EDGE_CASES, ids=list(EDGE_CASES))
@pytest.mark.parametrize("which", ["js", "bnpo"])
def test_edge_cases_match_the_reference(case, which):
    sizes, rewards = EDGE_CASES[case]
    uids, r = make_batch(np.random.default_rng(3), sizes)
    r = r if rewards is None else rewards
    fn, ref = (compute_js_advantages, reference_js) if which == "js" else (compute_bnpo_advantages, reference_bnpo)
    got = run(fn, uids, r)
    np.testing.assert_allclose(got, ref(uids, list(r)), atol=1e-9, rtol=1e-9)
    assert np.isfinite(got).all()


def test_integer_scores_give_float_advantages():
    uids = np.array(["a", "a", "a"])
    for fn in (compute_js_advantages, compute_bnpo_advantages):
        got = fn(Batch(torch.tensor([1, 0, 0]), uids, torch.ones(3, dtype=torch.bool))).values
        assert got.is_floating_point()
        np.testing.assert_allclose(got.numpy(), [2 / 3, -1 / 3, -1 / 3], rtol=1e-6)


def test_js_matches_its_closed_forms_by_hand():
    # one prompt: lambda = 0, the plain group mean (not leave-one-out): A = r - mean
    np.testing.assert_allclose(
        run(compute_js_advantages, np.array(["a"] * 3), [1.0, 0.0, 0.0]), [2 / 3, -1 / 3, -1 / 3]
    )
    # identical groups of zero variance: v = s = 0 -> lambda = 0, leave-one-out mean = r: A = 0
    assert not run(compute_js_advantages, np.array(["a", "a", "b", "b"]), [1.0, 1.0, 1.0, 1.0]).any()
    # two prompts: lambda_a = (1/2) w_b / w_b = 1/2 (s = 0 with one other prompt), mbar_a = mu_b
    uids = np.array(["a", "a", "b", "b"])
    got = run(compute_js_advantages, uids, [1.0, 0.0, 1.0, 0.0])
    # response a1: loo mean 0, mbar 0.5 -> baseline 0.25; a0: loo 1 -> 0.75
    np.testing.assert_allclose(got, [0.75, -0.75, 0.75, -0.75])


def test_bnpo_matches_its_closed_forms_by_hand():
    # one prompt (var_p = 0): alpha = beta = 1, pdf 1: A = r - p
    np.testing.assert_allclose(
        run(compute_bnpo_advantages, np.array(["a"] * 4), [1.0, 0, 0, 0]), [0.75, -0.25, -0.25, -0.25]
    )
    # p in {1/4, 3/4}: mean 1/2, var 1/8 -> nu = 1, a = b = 1/2 -> alpha = beta = 7/6
    uids = np.array(["a"] * 4 + ["b"] * 4)
    r = [1.0, 0, 0, 0, 1, 1, 1, 0]
    alpha = 7 / 6
    pdf = (0.25 * 0.75) ** (alpha - 1) * math.gamma(2 * alpha) / math.gamma(alpha) ** 2
    np.testing.assert_allclose(
        run(compute_bnpo_advantages, uids, r), [(x - p) / pdf for x, p in zip(r, [0.25] * 4 + [0.75] * 4, strict=True)]
    )


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 7), min_size=1, max_size=10),
    seed=st.integers(0, 2**31 - 1),
    kind=st.sampled_from(["binary", "pm1", "continuous"]),
)
def test_js_and_bnpo_match_the_reference_on_random_batches(sizes, seed, kind):
    uids, r = make_batch(np.random.default_rng(seed), sizes, kind)
    for fn, ref in ((compute_js_advantages, reference_js), (compute_bnpo_advantages, reference_bnpo)):
        if fn is compute_bnpo_advantages and kind == "continuous":  # bnpo: rewards in [0, 1] only
            r = np.round(np.random.default_rng(seed).uniform(0, 1, len(r)), 4)
        got = run(fn, uids, r)
        np.testing.assert_allclose(got, ref(uids, list(r)), atol=1e-8, rtol=1e-8)
        # rows in another order: the same advantage per row, bit for bit
        perm = np.random.default_rng(seed + 1).permutation(len(uids))
        assert np.array_equal(run(fn, uids[perm], r[perm]), got[perm])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), kind=st.sampled_from(["binary", "pm1", "continuous"]))
def test_spo_matches_the_reference_over_steps_with_recurring_prompts(seed, kind):
    rng = np.random.default_rng(seed)
    state, ref = SPOState(), ReferenceSPO()
    for _ in range(6):
        sizes = rng.integers(1, 6, size=rng.integers(1, 6)).tolist()
        uids, r = make_batch(rng, sizes, kind)
        # the stable key: prompts drawn from a pool of 8, so they recur across steps (fresh uid strings every step)
        pool = {u: f"prompt-{rng.integers(8)}" for u in sorted(set(uids))}
        keys = np.array([pool[u] for u in uids], dtype=object)
        got = spo_step(torch.as_tensor(r), keys, torch.ones(len(r), dtype=torch.bool), state).values
        np.testing.assert_allclose(got.numpy(), ref.step(keys, list(r)), atol=1e-9, rtol=1e-9)
    assert state.keys.tolist() == sorted(ref.tracker)
    np.testing.assert_allclose(np.stack([state.alpha, state.beta], 1), [ref.tracker[k] for k in sorted(ref.tracker)])


def test_spo_first_update_and_baselines_by_hand():
    state = SPOState()
    valid = torch.ones(6, dtype=torch.bool)
    keys = np.array(["7", "7", "7", "9", "9", "9"], dtype=object)
    r1 = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    a1 = spo_step(r1, keys, valid, state)
    x = r1.double() - 0.5  # unseen: baseline 0.5, then batch standardisation
    torch.testing.assert_close(a1.values.double(), (x - x.mean()) / (x.std() + EPS))
    # first update from (4, 4): alpha = 0.9 * 4 + rbar, beta = 0.9 * 4 + 1 - rbar
    assert state.keys.tolist() == ["7", "9"]
    np.testing.assert_allclose(state.alpha, [3.6 + 2 / 3, 3.6])
    np.testing.assert_allclose(state.beta, [3.6 + 1 / 3, 4.6])
    assert a1.diagnostics == {"spo/baseline_mean": 0.5, "spo/frac_seen": 0.0, "spo/prompts_tracked": 2.0}
    # step 2: the baseline is the tracker BEFORE this step's update; prompt "8" is new
    keys2 = np.array(["9", "9", "8", "8", "7", "7"], dtype=object)
    r2 = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    a2 = spo_step(r2, keys2, valid, state).values
    b7, b9 = (3.6 + 2 / 3) / 8.2, 3.6 / 8.2
    x = r2.double() - torch.tensor([b9, b9, 0.5, 0.5, b7, b7], dtype=torch.float64)
    torch.testing.assert_close(a2.double(), (x - x.mean()) / (x.std() + EPS))
    np.testing.assert_allclose(state.alpha, [0.9 * (3.6 + 2 / 3) + 0.5, 0.9 * 4 + 1.0, 0.9 * 3.6 + 0.5])
    assert state.keys.tolist() == ["7", "8", "9"] and state.steps == 2


def test_spo_padding_and_rewards_outside_unit_interval():
    state = SPOState()
    keys = np.array(["a", "a", None], dtype=object)
    got = spo_step(torch.tensor([2.0, -1.0, 5.0]), keys, torch.tensor([True, True, False]), state).values
    assert got[2] == 0 and state.keys.tolist() == ["a"]
    np.testing.assert_allclose(state.alpha, [3.6 + 0.5])  # mean 0.5 inside [0, 1]
    spo_step(torch.tensor([2.0, 3.0]), np.array(["a", "a"]), torch.ones(2, dtype=torch.bool), state)
    np.testing.assert_allclose([state.alpha[0], state.beta[0]], [0.9 * 4.1 + 1.0, 0.9 * 4.1])  # clamped to 1
    no_key = r"2 valid row\(s\) have no prompt key\(s\) \(extra_info\['index'\]\) \(None/NaN\); first rows: \[1, 2\]"
    with pytest.raises(ValueError, match=no_key):
        keys = np.array(["a", None, math.nan], dtype=object)
        spo_step(torch.ones(3), keys, torch.ones(3, dtype=torch.bool), state)
    with pytest.raises(ValueError, match=r"non-finite .* \['b'\]"):
        spo_step(torch.tensor([1.0, math.nan]), np.array(["a", "b"]), torch.ones(2, dtype=torch.bool), state)


def test_spo_state_dict_round_trip_and_checks():
    state = SPOState()
    rng = np.random.default_rng(5)
    for step in range(3):
        uids, r = make_batch(rng, [3, 2, 4], tag=str(step))
        spo_step(
            torch.as_tensor(r),
            np.array([u[-1] for u in uids]),
            torch.ones(len(r), dtype=torch.bool),
            state,
        )
    snapshot = json.loads(json.dumps(state.state_dict()))
    again = SPOState()
    again.load_state_dict(snapshot)
    assert again.state_dict() == state.state_dict() and again.steps == 3
    for bad, pattern in [
        ({**snapshot, "version": 9}, "version=9"),
        ({k: v for k, v in snapshot.items() if k != "beta"}, r"missing field\(s\) \['beta'\]"),
        ({**snapshot, "alpha": snapshot["alpha"][:1]}, r"one length, got \[1, 3\]"),
        ({**snapshot, "keys": snapshot["keys"][::-1]}, "sorted and unique"),
        ({**snapshot, "beta": [-1.0] * 3}, r"beta\[0\]=-1.0 is refused"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            SPOState().load_state_dict(bad)


@pytest.mark.parametrize(
    ("mapping", "pattern"),
    [
        ({"rho": 1.0}, r"rho=1.0 is invalid; use a float in \(0, 1\)"),
        ({"n0": 0}, "n0=0 is invalid"),
        ({"prompt_key": ""}, "prompt_key='' is invalid"),
        ({"promptkey": "index"}, r"unknown option algorithm\.spo\.promptkey; did you mean .*prompt_key\?"),
    ],
)
def test_spo_options_are_validated(mapping, pattern):
    with pytest.raises(ValueError, match=pattern):
        SPOOptions.from_mapping(mapping)


# -------------------------------------------------------------------------------- through verl's registry


def make_dataproto(uids, rewards, length: int = 5, pad: int = 0) -> DataProto:
    """Reward on the last valid token of responses of length 1..length, plus ``pad`` padding rows."""
    bs = len(uids)
    lengths = np.concatenate([1 + np.arange(bs) % length, np.zeros(pad, dtype=int)])
    mask = torch.from_numpy(np.arange(length)[None, :] < lengths[:, None]).float()
    tlr = torch.zeros(bs + pad, length)
    tlr[torch.arange(bs), torch.from_numpy(lengths[:bs] - 1)] = torch.as_tensor(rewards, dtype=torch.float32)
    all_uids = np.concatenate([np.asarray(uids, dtype=object), np.array([f"pad{i}" for i in range(pad)], dtype=object)])
    return DataProto.from_dict(
        tensors={"token_level_rewards": tlr, "response_mask": mask}, non_tensors={"uid": all_uids}
    )


@pytest.mark.parametrize(("name", "ref"), [("shrinkage_js", reference_js), ("bnpo", reference_bnpo)])
def test_registered_estimators_through_verl_compute_advantage_skip_padding(name, ref):
    uids, r = make_batch(np.random.default_rng(11), [4, 3, 4, 1])
    data = compute_advantage(make_dataproto(uids, r, pad=3), name, config=OmegaConf.create({}))
    adv = data.batch["advantages"]
    mask = data.batch["response_mask"]
    torch.testing.assert_close(adv, adv[:, :1] * mask)  # one value per response, broadcast over its tokens
    np.testing.assert_allclose(adv[: len(uids), 0].numpy(), ref(uids, list(r)), atol=1e-5)
    assert not adv[len(uids) :].any()
    torch.testing.assert_close(data.batch["returns"], adv)


def test_registered_spo_refuses_to_run_without_stable_keys():
    uids, r = make_batch(np.random.default_rng(0), [2, 2])
    with pytest.raises(ValueError, match=r"spo needs a stable prompt key per row .* extra_info\['index'\]"):
        compute_advantage(make_dataproto(uids, r), "spo", config=OmegaConf.create({}))
    fn = get_adv_estimator_fn("spo")
    data = make_dataproto(uids, r, pad=1)
    keys = np.array([u.split("-")[1] for u in uids] + [None], dtype=object)
    config = OmegaConf.create({"spo": {"rho": 0.5}})
    adv, _ = fn(
        data.batch["token_level_rewards"],
        data.batch["response_mask"],
        data.non_tensor_batch["uid"],
        config,
        prompt_keys=keys,
    )
    reference = ReferenceSPO(rho=0.5)
    np.testing.assert_allclose(adv[:-1, 0].numpy(), reference.step(keys[:-1], list(r)), atol=1e-6)
    tracker = DEFAULT_SPO.state
    assert not adv[-1].any() and tracker.steps == 1
    assert tracker.keys.tolist() == ["q0", "q1"]
    np.testing.assert_allclose(tracker.alpha, [reference.tracker["q0"][0], reference.tracker["q1"][0]])


def test_prompt_key_checks_name_the_problem():
    check_prompt_keys([{"index": 0}, {"index": 1}], "index", "x.parquet", SPO)
    with pytest.raises(EBPOConfigError, match=r"prompt_key='uid' is not a key of extra_info .* \['index', 'split'\]"):
        check_prompt_keys([{"index": 0, "split": "train"}], "uid", "x.parquet", SPO)
    with pytest.raises(EBPOConfigError, match=r"missing or null in 2 of 3 training rows .* first rows: \[1, 2\]"):
        check_prompt_keys([{"index": 0}, {"index": None}, {"index": float("nan")}], "index", "x.parquet", SPO)
    with pytest.raises(EBPOConfigError, match=r"not unique .* 1 row\(s\) repeat .* '0' at rows 0 and 2"):
        check_prompt_keys([{"index": 0}, {"index": 1}, {"index": 0}], "index", "a.parquet,b.parquet", SPO)


# ------------------------------------------------------------------------ SPO resume through the trainer


PROMPTS, GROUP = 4, 3
SPO_ROWS = [i % 6 for i in range(8 * PROMPTS)]
"""The trainer's prompt ids: 2 passes over 6 prompts, so every prompt recurs and the tracker matters."""


@pytest.fixture
def _config(compose_config):
    """``_config(tmp_path=None, *overrides)``: an spo run's config (tests/conftest.py's composer)."""

    def composed(tmp_path: Path | None = None, *overrides: str):
        ckpt = [f"trainer.default_local_dir={tmp_path / 'ckpt'}"] if tmp_path else []
        return compose_config("algorithm.adv_estimator=spo", "actor_rollout_ref.rollout.n=3", *ckpt, *overrides)

    return composed


def _step(trainer, step: int) -> torch.Tensor:
    prompt_ids = next(trainer._data_iter).tolist()
    rewards, uids, infos = [], [], []
    for pid in prompt_ids:
        gen = torch.Generator().manual_seed(1000 * step + pid)
        rewards += (torch.rand(GROUP, generator=gen) < (pid + 1) / 7).float().tolist()
        uids += [f"fresh-{step}-{pid}"] * GROUP  # verl's uid: new every step
        infos += [{"index": pid, "topic": "t"}] * GROUP
    uids.append("pad0")
    infos.append(infos[0])
    data = make_dataproto(np.array(uids[:-1], dtype=object), rewards, pad=1)
    keys = extra_info_values(infos, uids, [u.startswith("pad") for u in uids], "index", "algorithm.spo.prompt_key")
    data.batch["advantages"], data.batch["returns"], _ = advantage_step(data, trainer.estimator, keys)
    return data.batch["advantages"].clone()


def test_spo_resume_through_checkpoint_reproduces_the_uninterrupted_run(tmp_path, stand_in_trainer, _config):
    config = _config(tmp_path)
    uninterrupted = stand_in_trainer.run(stand_in_trainer(config, SPO_ROWS, PROMPTS), range(1, 8), _step)
    reference = ReferenceSPO()

    first = stand_in_trainer(config, SPO_ROWS, PROMPTS)
    before = stand_in_trainer.run(first, range(1, 4), _step)
    first.global_steps = 3
    first._save_checkpoint()
    step_dir = tmp_path / "ckpt" / "global_step_3"
    saved = json.loads((step_dir / SPO.state.file).read_text())
    assert saved["global_step"] == 3 and saved["state"]["steps"] == 3 and saved["options"]["prompt_key"] == "index"
    assert saved["state"]["keys"] == ["0", "1", "2", "3", "4", "5"]

    resumed = stand_in_trainer(config, SPO_ROWS, PROMPTS)
    stand_in_trainer.run(resumed, range(90, 92), _step)  # unrelated tracker contents before the load
    resumed._load_checkpoint()
    assert resumed.global_steps == 3 and resumed.estimator.state.state_dict() == saved["state"]
    resumed._data_iter = iter(resumed.train_dataloader)  # continues at prompt 12 from data.pt
    after = stand_in_trainer.run(resumed, range(4, 8), _step)
    for a, b in zip(before + after, uninterrupted, strict=True):
        assert torch.equal(a, b)

    # the run follows the plain-loop reference, and the tracker matters (an empty one would give other values)
    for step, adv in enumerate(uninterrupted, start=1):
        ids = [i % 6 for i in range(8 * PROMPTS)][(step - 1) * PROMPTS : step * PROMPTS]
        keys = [str(pid) for pid in ids for _ in range(GROUP)]
        rewards = []
        for pid in ids:
            gen = torch.Generator().manual_seed(1000 * step + pid)
            rewards += (torch.rand(GROUP, generator=gen) < (pid + 1) / 7).float().tolist()
        np.testing.assert_allclose(adv[:-1, 0].numpy(), reference.step(keys, rewards), atol=1e-5)
        if step > 1:
            assert not np.allclose(adv[:-1, 0].numpy(), ReferenceSPO().step(keys, rewards), atol=1e-3)
    fresh = SPOState()
    with pytest.raises(ValueError, match="has no spo_state.json"):  # on_resume_mismatch=error (the default)
        load_state(SPO, tmp_path, fresh, SPOOptions(), 3)
    with pytest.warns(RuntimeWarning, match="no spo_state.json"):
        load_state(SPO, tmp_path, fresh, SPOOptions(on_resume_mismatch="reset"), 3)
    assert fresh.steps == 0


def test_spo_state_file_of_another_step_or_options_or_corrupt_follows_the_resume_rules(
    tmp_path, stand_in_trainer, _config
):
    config = _config(tmp_path)
    trainer = stand_in_trainer(config, SPO_ROWS, PROMPTS)
    stand_in_trainer.run(trainer, range(1, 3), _step)
    trainer.global_steps = 2
    trainer._save_checkpoint()
    path = tmp_path / "ckpt" / "global_step_2" / SPO.state.file
    with pytest.raises(ValueError, match="written at global step 2, not 5"):
        load_state(SPO, path.parent, SPOState(), SPOOptions(), 5)
    saved = SPOState()
    load_state(SPO, path.parent, saved, SPOOptions(), 2)
    # another option: on_resume_mismatch decides, as for algorithm.ebpo (default error, the three ways out)
    with pytest.raises(ValueError, match=r"rho: 0.9 -> 0.5.*algorithm.spo.rho=0.9.*mismatch=reset.*mismatch=keep"):
        load_state(SPO, path.parent, SPOState(), SPOOptions(rho=0.5), 2)
    with pytest.warns(RuntimeWarning, match=r"rho: 0.9 -> 0.5\); on_resume_mismatch=reset"):
        assert not load_state(SPO, path.parent, SPOState(), SPOOptions(rho=0.5, on_resume_mismatch="reset"), 2)
    kept = SPOState()
    with pytest.warns(RuntimeWarning, match=r"rho: 0.9 -> 0.5\); on_resume_mismatch=keep"):
        assert load_state(SPO, path.parent, kept, SPOOptions(rho=0.5, on_resume_mismatch="keep"), 2)
    assert kept.state_dict() == saved.state_dict() and saved.steps == 2
    for mode in ("error", "keep"):  # another prompt_key never continues with the saved tracker
        with pytest.raises(ValueError, match=r"prompt_key: 'index' -> 'source_id'.*prompt_key=index") as err:
            load_state(SPO, path.parent, SPOState(), SPOOptions(prompt_key="source_id", on_resume_mismatch=mode), 2)
        assert "=keep" not in str(err.value)
    path.write_text('{"format": 1, "global_step": 2, "state": {"version": 1}}')
    with pytest.raises(ValueError, match=r"is unreadable: SPO state: missing field\(s\)"):
        load_state(SPO, path.parent, SPOState(), SPOOptions(), 2)
    path.write_text('{"format": 1, "glo')
    with pytest.raises(ValueError, match="is unreadable: .*Delete it to resume with fresh SPO trackers"):
        load_state(SPO, path.parent, SPOState(), SPOOptions(), 2)
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # no temp file left


@pytest.mark.parametrize(
    ("state", "problem"),
    [
        ([], "SPO state: [] is refused: it must be a JSON object"),
        ({"version": 1, "steps": -5, "keys": [], "alpha": [], "beta": []}, "steps=-5"),
        ({"version": 1, "steps": 1.5, "keys": [], "alpha": [], "beta": []}, "steps=1.5"),
        ({"version": 1, "steps": 1, "keys": ["a"], "alpha": [[4.0]], "beta": [4.0]}, "alpha[0]=[4.0] is refused"),
        ({"version": 1, "steps": 1, "keys": ["a", "b"], "alpha": [4.0, 4.0], "beta": [4.0]}, "must have one length"),
        ({"version": 1, "steps": 1, "keys": ["a"], "alpha": [float("inf")], "beta": [4.0]}, "alpha[0]=inf is refused"),
        ({"version": 1, "steps": 1, "keys": ["a"], "alpha": ["4"], "beta": [4.0]}, "alpha[0]='4' is refused"),
        (
            {"version": 1, "steps": 1, "keys": [1], "alpha": [4.0], "beta": [4.0]},
            "keys[0]=1 is refused: it must be a str",
        ),
        ({"version": 1, "steps": 1, "keys": ["b", "a"], "alpha": [4.0, 4.0], "beta": [4.0, 4.0]}, "sorted"),
        (
            {"version": 1, "steps": 1, "keys": ["a"], "alpha": [0.0], "beta": [0.0]},
            "key 'a'=0.0 is refused: it must be > 0",
        ),
    ],
)
def test_spo_state_file_fields_are_validated(tmp_path, state, problem):
    payload = {"format": 1, "global_step": 2, "options": {}, "state": state}
    (tmp_path / SPO.state.file).write_text(json.dumps(payload))
    target = SPOState(steps=7)
    with pytest.raises(ValueError, match=rf"{SPO.state.file} is unreadable: .*{re.escape(problem)}"):
        load_state(SPO, tmp_path, target, SPOOptions(), 2)
    assert target.steps == 0 and len(target.keys) == 0


@pytest.mark.slow
def test_spo_dataset_check_on_prepared_data(hub_data, tiny_tokenizer, tmp_path, _config):
    """ebpo_verl.data's extra_info.index is a unique key within a file; two files repeat it, which is refused."""
    from ebpo_verl.data import dapo_math, math500

    math = math500.prepare(tmp_path / "m", local_path=hub_data / "math500.jsonl")
    dapo = dapo_math.prepare(tmp_path / "d", local_path=hub_data / "dapo_math_sample.jsonl")
    n_math = pq.read_metadata(math).num_rows

    def trainer_on(files: str, *overrides: str):
        config = _config(None, f"data.train_files={files}", f"data.val_files={math}", "data.train_batch_size=16")
        trainer = ebpo_trainer_cls("sync")(OmegaConf.merge(config, OmegaConf.from_dotlist(list(overrides))))
        trainer.tokenizer, trainer.processor = tiny_tokenizer, None
        return trainer

    trainer_on(str(math))._init_dataloader()
    trainer_on(f"[{math},{dapo}]", "algorithm.spo.prompt_key=source_id")._init_dataloader()
    with pytest.raises(EBPOConfigError, match=rf"extra_info\['index'\] .* is not unique .* '0' at rows 0 and {n_math}"):
        trainer_on(f"[{math},{dapo}]")._init_dataloader()
    with pytest.raises(EBPOConfigError, match=r"prompt_key='uid' is not a key of extra_info"):
        trainer_on(str(math), "algorithm.spo.prompt_key=uid")._init_dataloader()


def test_check_config_refuses_bad_spo_options(_config):
    check_config(_config())
    with pytest.raises(EBPOConfigError, match="algorithm.spo.rho=2.0 is invalid"):
        check_config(_config(None, "algorithm.spo.rho=2.0"))


# ---------------------------------------------------------------------------------- Ray, TransferQueue


@pytest.mark.slow
def test_registered_in_a_ray_actor_through_the_entry_point_alone(ray_local):
    """In a fresh Ray worker that never imported the package, importing verl registers every estimator of the
    package (``ebpo`` and the three baselines) through the ``verl.plugins`` entry point alone."""

    @ray_local.remote
    class Probe:
        def check(self):
            before = "ebpo_verl" in sys.modules
            import verl  # noqa: F401  (loads the verl.plugins entry points)
            from verl.trainer.ppo.core_algos import get_adv_estimator_fn

            return before, {n: get_adv_estimator_fn(n).__module__ for n in ("shrinkage_js", "bnpo", "spo", "ebpo")}

    before, modules = ray_local.get(Probe.remote().check.remote(), timeout=300)
    assert not before and set(modules.values()) == {"ebpo_verl.trainer.adapter"}


@pytest.mark.slow
def test_spo_advantage_step_through_transfer_queue(ray_local, _config):
    """verl's v1 flow: rows in TransferQueue -> _compute_advantage -> keys from extra_info reach the tracker."""
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    try:
        trainer = ebpo_trainer_cls("sync")(_config())
        scores = {"u-a": [1, 1, 0], "u-b": [0, 0, 1]}
        index = {"u-a": 17, "u-b": 4}
        keys, rows, tags = [], [], []
        for uid, group in scores.items():
            for session, score in enumerate(group):
                keys.append(f"{uid}_{session}_0")
                rows.append(
                    {
                        "uid": uid,
                        "response_mask": torch.ones(2, dtype=torch.int64),
                        "rm_scores": torch.tensor([0.0, float(score)]),
                        "extra_info": {"index": index[uid]},
                    }
                )
                tags.append({"status": "success"})
        keys.append("padfeed_0_0")
        rows.append({**rows[0], "uid": "padfeed", "response_mask": torch.zeros(1, dtype=torch.int64)})
        rows[-1]["rm_scores"] = torch.zeros(1)
        tags.append({"status": "success", "is_padding": True})
        tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(rows), tags=tags)
        metrics: dict = {}
        trainer.estimator.state.load_state_dict(
            {"version": 1, "steps": 5, "keys": ["17"], "alpha": [3.0], "beta": [1.0]}
        )
        trainer._compute_advantage(KVBatchMeta(partition_id="train", keys=keys, tags=tags), metrics)
        out = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages"])
        advantages = out["advantages"].unbind()
        tq.kv_clear(keys=keys, partition_id="train")
    finally:
        tq.close()
    x = np.array([1, 1, 0, 0, 0, 1]) - np.array([0.75] * 3 + [0.5] * 3)  # prompt 17 seen: 3 / (3 + 1)
    expected = (x - x.mean()) / (x.std(ddof=1) + EPS)
    for row, value in enumerate(expected):
        assert advantages[row].tolist() == pytest.approx([value] * 2, abs=1e-6)
    assert advantages[-1].tolist() == [0.0]
    assert metrics["spo/frac_seen"] == 0.5 and metrics["spo/prompts_tracked"] == 2
    assert trainer.estimator.state.keys.tolist() == ["17", "4"] and trainer.estimator.state.steps == 6


# ------------------------------------------------------------------------------------------- benchmark


@pytest.mark.slow
def test_benchmark_times_the_baselines_against_grpo_vectorized():
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_advantage.py"), "--shapes", "8x4x16", "--repeats", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for name in ("shrinkage_js", "bnpo", "spo"):
        assert f"{name}/grpo_vectorized = " in out.stdout


# ---------------------------------------------------------------------------------------------- CPU study


@pytest.mark.parametrize("name", ["shrinkage_js", "bnpo", "spo"])
@pytest.mark.slow
def test_study_runs_the_baselines_with_problem_indices_as_spo_keys(name, monkeypatch):
    """The study runs each with its own object (the default instance stays untouched); spo's tracker is keyed by
    the training problems' indices."""
    from ebpo_verl.algos import registry
    from ebpo_verl.study.policy import PolicyConfig, TinyPolicy
    from ebpo_verl.study.presets import PRESETS
    from ebpo_verl.study.rl import ESTIMATORS, RLConfig, order_stream, run_rl
    from ebpo_verl.study.tasks import make_splits

    started, new = [], registry.new_estimator
    monkeypatch.setattr(registry, "new_estimator", lambda *a: started.append(new(*a)) or started[-1])

    assert name in ESTIMATORS and (name == "spo") == (name in PRESETS["full"].estimators)  # full: the rows
    torch.manual_seed(0)
    splits = make_splits({"heldout": 2, "train": 2}, seed=0, topics=("add",))
    train, held = splits["train"], splits["heldout"]
    cfg = RLConfig(estimator=name, group_size=4, steps=4, responses_per_step=16, eval_every=2)
    base_pass = np.zeros(len(train))
    out = run_rl(TinyPolicy(PolicyConfig()), train, held, base_pass, cfg)
    assert len(out["reward"]) == 4 and np.isfinite(out["grad_norm"]).all()
    assert len(started) == 1 and DEFAULT_SPO.state.steps == 0
    if name == "spo":  # one tracker entry per training problem the run drew, by its index in the split
        tracker = started[0].state
        assert tracker.steps == 4
        assert tracker.keys.tolist() == sorted({str(i) for i in order_stream(train, cfg, base_pass)})


def test_bnpo_paper_reward_maps_to_pass_rates_and_back():
    # one prompt, 1 pass in 4, -1/+1 reward: var_p = 0 -> Beta(1, 1), pdf 1; pass rate 1/4, expected reward -1/2
    adv = run(compute_bnpo_advantages, np.array(["a"] * 4, dtype=object), [1.0, -1.0, -1.0, -1.0])
    np.testing.assert_allclose(adv, [1.5, -0.5, -0.5, -0.5], atol=1e-15)
    # two levels on many prompts: exactly twice the 0/1 advantage (not ~1e6 from clamped negative means)
    uids, r01 = make_batch(np.random.default_rng(3), [4, 4, 4, 2, 3])
    pm1 = run(compute_bnpo_advantages, uids, 2 * r01 - 1)
    np.testing.assert_allclose(pm1, 2 * run(compute_bnpo_advantages, uids, r01), rtol=1e-12, atol=1e-12)
    assert np.abs(pm1).max() < 10


@pytest.mark.parametrize(("rewards", "cause"), [([-1.0, 0.0, 1.0, 1.0], "-1.0, 0.0, 1.0"), ([0.0, 2.0, 1, 0], "2.0")])
def test_bnpo_refuses_other_rewards_naming_the_cause(rewards, cause):
    with pytest.raises(ValueError, match="bnpo needs rewards in \\[0, 1\\]") as err:
        run(compute_bnpo_advantages, np.array(["a", "a", "b", "b"], dtype=object), rewards)
    assert cause in str(err.value) and "use_kl_in_reward" in str(err.value)


def test_bnpo_concentrated_batch_is_the_papers_formula_and_reports_max_abs_adv():
    # 99 prompts at 3/4 and one at 1/4 (G = 4, 0/1 reward): the Beta fit is sharp, pdf(1/4) ~ 2e-6
    uids = np.repeat([f"q{i}" for i in range(100)], 4).astype(object)
    r = np.tile([1.0, 1.0, 1.0, 0.0], 100)
    r[-4:] = [1.0, 0.0, 0.0, 0.0]
    got = compute_bnpo_advantages(Batch(torch.as_tensor(r), uids, torch.ones(len(r), dtype=torch.bool)))
    ref = reference_bnpo(uids, list(r))
    np.testing.assert_allclose(got.values.numpy(), ref, rtol=1e-9)
    assert 1e5 < np.abs(ref).max() < 1e6  # ~1.1e5: the fork's formula, kept as is
    assert got.diagnostics["bnpo/max_abs_adv"] == pytest.approx(np.abs(ref).max(), rel=1e-9)
