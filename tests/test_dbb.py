"""dbb (Discounted Beta-Bernoulli, arXiv 2603.18444) against hand computations and a plain loop of the paper's
Eqs. 11-13; its state through JSON and through the trainer's checkpoint (exact resume); registration."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from verl import DataProto

from ebpo_verl.algos.dbb import DBBOptions, DBBState, compute_dbb_advantages
from ebpo_verl.algos.estimator import Batch
from ebpo_verl.algos.registry import get
from ebpo_verl.ops.errors import EBPOConfigError
from ebpo_verl.trainer.adapter import advantage_step
from ebpo_verl.trainer.checkpoint.state import load_state, save_state
from ebpo_verl.trainer.preflight import check_config
from ebpo_verl.trainer.ray_trainer import extra_info_values

DBB = get("dbb")


def _adv(rewards, keys, options, state, valid=None):
    r = torch.tensor(rewards, dtype=torch.float32)
    v = torch.ones(len(r), dtype=torch.bool) if valid is None else torch.tensor(valid)
    keys = np.array(keys, dtype=object)
    return compute_dbb_advantages(Batch(r, keys, v, keys), options, state).values.numpy()


class ReferenceDBB:
    """The paper's update as a plain loop: per key (alpha, beta) from the prior, alpha = lam alpha + S,
    beta = lam beta + N - S (Eq. 11), then A = (x - p) / sqrt(p (1 - p)), p = alpha / (alpha + beta)."""

    def __init__(self, lam: float, prior=(1.0, 1.0)):
        self.lam, self.prior, self.post = lam, prior, {}

    def step(self, keys, rewards) -> list[float]:
        by_key: dict[str, list[float]] = {}
        for k, r in zip(keys, rewards, strict=True):
            by_key.setdefault(str(k), []).append(r)
        p = {}
        for k, rs in by_key.items():
            a, b = self.post.get(k, self.prior)
            a, b = self.lam * a + sum(rs), self.lam * b + len(rs) - sum(rs)
            self.post[k] = (a, b)
            p[k] = a / (a + b)
        return [(r - p[str(k)]) / math.sqrt(p[str(k)] * (1 - p[str(k)])) for k, r in zip(keys, rewards, strict=True)]


def test_two_visits_update_the_posterior_and_advantages_as_computed_by_hand():
    state, opts = DBBState(), DBBOptions(discount=0.5)
    # visit 1 of "a": N=4, S=1 -> alpha = 0.5*1 + 1 = 1.5, beta = 0.5*1 + 3 = 3.5, p = 0.3, sd = sqrt(0.21)
    # "b" (N=2, S=2): alpha = 2.5, beta = 0.5, p = 5/6
    adv = _adv([1, 0, 0, 0, 1, 1], ["a"] * 4 + ["b"] * 2, opts, state)
    sd = math.sqrt(0.21)
    np.testing.assert_allclose(adv, [0.7 / sd, -0.3 / sd, -0.3 / sd, -0.3 / sd, *[(1 / 6) / math.sqrt(5 / 36)] * 2])
    np.testing.assert_array_equal(state.keys, ["a", "b"])
    np.testing.assert_allclose(state.alpha, [1.5, 2.5])
    np.testing.assert_allclose(state.beta, [3.5, 0.5])
    # visit 2 of "a": N=4, S=2 -> alpha = 0.75 + 2 = 2.75, beta = 1.75 + 2 = 3.75, p = 2.75/6.5 = 11/26;
    # "b" is absent and keeps (2.5, 0.5): one discount per visit
    adv = _adv([1, 1, 0, 0], ["a"] * 4, opts, state)
    p = 11 / 26
    np.testing.assert_allclose(adv, [(1 - p) / math.sqrt(p * (1 - p))] * 2 + [-p / math.sqrt(p * (1 - p))] * 2)
    np.testing.assert_allclose(state.alpha, [2.75, 2.5])
    np.testing.assert_allclose(state.beta, [3.75, 0.5])
    r = torch.ones(4, dtype=torch.float32)
    keys = np.array(["a"] * 4, dtype=object)
    frac_seen = compute_dbb_advantages(Batch(r, keys, r.bool(), keys), opts, state).diagnostics
    assert state.steps == 3 and frac_seen["dbb/frac_seen"] == 1.0


def test_all_correct_first_visit_is_not_zero_and_dr_grpo_form():
    # N=8, lambda=0.5, all correct: alpha = 8.5, beta = 0.5, p = 17/18; A = (1/18) / sqrt(17/18 * 1/18) = 1/sqrt(17)
    adv = _adv([1.0] * 8, ["q"] * 8, DBBOptions(discount=0.5), DBBState())
    np.testing.assert_allclose(adv, [1 / math.sqrt(17)] * 8, rtol=1e-6)
    adv = _adv([1.0] * 8, ["q"] * 8, DBBOptions(discount=0.5, normalize=False), DBBState())
    np.testing.assert_allclose(adv, [1 / 18] * 8, rtol=1e-6)


@pytest.mark.parametrize("lam", [1.0, 0.75, 0.25])
def test_matches_the_reference_over_steps_with_recurring_prompts(lam):
    rng = np.random.default_rng(int(lam * 100))
    state, ref = DBBState(), ReferenceDBB(lam)
    for _ in range(12):
        ids = rng.choice(7, size=3, replace=False)
        keys = [f"p{i}" for i in ids for _ in range(4)]
        rewards = (rng.random(len(keys)) < np.repeat((ids + 1) / 8, 4)).astype(float).tolist()
        order = rng.permutation(len(keys))  # the row order does not matter
        adv = _adv([rewards[i] for i in order], [keys[i] for i in order], DBBOptions(discount=lam), state)
        want = ref.step(keys, rewards)
        np.testing.assert_allclose(adv, [want[i] for i in order], rtol=1e-6, atol=1e-6)
    for k, (a, b) in ref.post.items():
        i = list(state.keys).index(k)
        assert math.isclose(state.alpha[i], a) and math.isclose(state.beta[i], b)


def test_padding_rows_get_zero_and_the_paper_reward_equals_the_0_1_reward():
    state = DBBState()
    adv = _adv([1, 0, 1, 5], ["a", "a", "b", None], DBBOptions(), state, valid=[True, True, True, False])
    assert adv[3] == 0 and list(state.keys) == ["a", "b"]
    pm = _adv([1, -1, 1], ["a", "a", "b"], DBBOptions(), DBBState())  # -1/+1 reward = 0/1 reward, normalised
    np.testing.assert_allclose(pm, adv[:3], rtol=1e-6)
    with pytest.raises(ValueError, match=r"dbb needs 0/1 rewards .* prompt key\(s\) \['a'\]"):
        _adv([0.5, 2.0], ["a", "a"], DBBOptions(), DBBState())


@pytest.mark.parametrize(
    ("mapping", "pattern"),
    [
        ({"discount": 0.0}, r"algorithm.dbb.discount=0.0 is invalid; use a float in \(0, 1\]"),
        ({"discount": 1.5}, "discount=1.5 is invalid"),
        ({"prior_alpha": -1}, "prior_alpha=-1 is invalid"),
        ({"normalize": "yes"}, "normalize='yes' is invalid"),
        ({"on_resume_mismatch": "x"}, "on_resume_mismatch='x' is invalid"),
        ({"discout": 0.5}, "unknown option algorithm.dbb.discout; did you mean algorithm.dbb.discount"),
    ],
)
def test_options_are_validated(mapping, pattern):
    with pytest.raises(ValueError, match=pattern):
        DBBOptions.from_mapping(mapping)


def test_state_dict_round_trips_and_a_bad_field_changes_nothing():
    state = DBBState()
    _adv([1, 0, 1, 1], ["b", "b", "a", "a"], DBBOptions(discount=0.3), state)
    copy = DBBState()
    copy.load_state_dict(json.loads(json.dumps(state.state_dict())))
    assert copy.state_dict() == state.state_dict()
    for bad, problem in [
        ({**state.state_dict(), "version": 9}, "version=9"),
        ({**state.state_dict(), "alpha": [1.0, -2.0]}, r"alpha\[1\]=-2.0 is refused: .* \[0, 2\*\*53\]"),
        ({**state.state_dict(), "keys": ["b", "a"]}, "sorted and unique"),
        ({**state.state_dict(), "beta": [1.0]}, r"keys, alpha, beta must have one length, got \[1, 2\]"),
    ]:
        with pytest.raises(ValueError, match=problem):
            copy.load_state_dict(bad)
        assert copy.state_dict() == state.state_dict()  # unchanged


def test_save_load_continue_equals_uninterrupted(tmp_path):
    rng = np.random.default_rng(3)
    batches = []
    for _ in range(8):
        ids = rng.choice(5, size=2, replace=False)
        batches.append(([str(i) for i in ids for _ in range(3)], rng.integers(0, 2, 6).astype(float).tolist()))
    opts = DBBOptions(discount=0.6)
    whole = DBBState()
    uninterrupted = [_adv(r, k, opts, whole) for k, r in batches]
    first = DBBState()
    before = [_adv(r, k, opts, first) for k, r in batches[:4]]
    save_state(DBB, tmp_path, first, opts, 4)
    resumed = DBBState()
    _adv([1, 1], ["0", "0"], opts, resumed)  # stale contents are replaced
    assert load_state(DBB, tmp_path, resumed, opts, 4)
    after = [_adv(r, k, opts, resumed) for k, r in batches[4:]]
    for a, b in zip(before + after, uninterrupted, strict=True):
        np.testing.assert_array_equal(a, b)
    assert resumed.state_dict() == whole.state_dict()
    with pytest.raises(ValueError, match=r"algorithm.dbb differs .*\(discount: 0.6 -> 0.5\)"):
        load_state(DBB, tmp_path, DBBState(), DBBOptions(discount=0.5), 4)
    with pytest.raises(ValueError, match="has no dbb_state.json"):
        load_state(DBB, tmp_path / "nothing", DBBState(), opts, 4)


# ------------------------------------------------------------------------ through the trainer's checkpoint

PROMPTS, GROUP = 4, 3
DBB_ROWS = [i % 6 for i in range(8 * PROMPTS)]
"""The trainer's prompt ids: prompts recur from step 3 on."""


@pytest.fixture
def _config(compose_config):
    """``_config(tmp_path)``: a dbb run's config (tests/conftest.py's composer)."""

    def composed(tmp_path: Path):
        return compose_config(
            "algorithm.adv_estimator=dbb",
            "algorithm.dbb.discount=0.5",
            "actor_rollout_ref.rollout.n=3",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        )

    return composed


def _step(trainer, step: int) -> tuple[torch.Tensor, list[str], list[float]]:
    prompt_ids = next(trainer._data_iter).tolist()
    rewards, uids, infos = [], [], []
    for pid in prompt_ids:
        gen = torch.Generator().manual_seed(1000 * step + pid)
        rewards += (torch.rand(GROUP, generator=gen) < (pid + 1) / 7).float().tolist()
        uids += [f"fresh-{step}-{pid}"] * GROUP
        infos += [{"index": pid}] * GROUP
    uids.append("pad0")
    infos.append(infos[0])
    mask = torch.ones(len(uids), 2)
    mask[-1] = 0
    tlr = torch.zeros(len(uids), 2)
    tlr[:-1, 1] = torch.tensor(rewards)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": tlr, "response_mask": mask}, non_tensors={"uid": np.array(uids, dtype=object)}
    )
    keys = extra_info_values(infos, uids, [u.startswith("pad") for u in uids], "index", "algorithm.dbb.prompt_key")
    data.batch["advantages"], data.batch["returns"], _ = advantage_step(data, trainer.estimator, keys)
    return data.batch["advantages"][:, 0].clone(), [str(info["index"]) for info in infos[:-1]], rewards


def test_trainer_checkpoint_resume_reproduces_the_uninterrupted_run(tmp_path, stand_in_trainer, _config):
    config = _config(tmp_path)
    uninterrupted = stand_in_trainer.run(stand_in_trainer(config, DBB_ROWS, PROMPTS), range(1, 8), _step)
    ref = ReferenceDBB(0.5)
    for adv, keys, rewards in uninterrupted:  # the paper's update, prompts recurring from step 3 on
        np.testing.assert_allclose(adv[:-1].numpy(), ref.step(keys, rewards), rtol=1e-5)
        assert adv[-1] == 0

    first = stand_in_trainer(config, DBB_ROWS, PROMPTS)
    before = stand_in_trainer.run(first, range(1, 4), _step)
    first.global_steps = 3
    first._save_checkpoint()
    saved = json.loads((tmp_path / "ckpt" / "global_step_3" / DBB.state.file).read_text())
    assert saved["global_step"] == 3 and saved["options"]["discount"] == 0.5 and saved["state"]["steps"] == 3
    resumed = stand_in_trainer(config, DBB_ROWS, PROMPTS)
    stand_in_trainer.run(resumed, range(90, 92), _step)  # unrelated posteriors before the load
    resumed._load_checkpoint()
    assert resumed.global_steps == 3 and resumed.estimator.state.state_dict() == saved["state"]
    resumed._data_iter = iter(resumed.train_dataloader)
    after = stand_in_trainer.run(resumed, range(4, 8), _step)
    for (a, _, _), (b, _, _) in zip(before + after, uninterrupted, strict=True):
        assert torch.equal(a, b)


def test_check_config_refuses_bad_dbb_options(tmp_path, compose_config, _config):
    cfg = compose_config("algorithm.adv_estimator=dbb", "algorithm.dbb.discount=2")
    with pytest.raises(EBPOConfigError, match="algorithm.dbb.discount=2 is invalid"):
        check_config(cfg)
