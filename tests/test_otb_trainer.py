"""verl's Optimal Token Baseline through the package's v1 trainer (verl 0.9.1's v1 trainer alone never asks the
actor for the sum of squared token probabilities nor passes it to the estimator; ebpo_verl.trainer.ray_trainer does
both).

The response slice of the actor's sum_pi_squared is checked against a recomputation from a model's logits; the
copied advantage step against verl's own method on the same rows (KL penalty and rollout correction on and off)
and against OTB's formula by hand through TransferQueue; the end-to-end run trains two steps with
``algorithm.adv_estimator=optimal_token_baseline`` on the CPU backend."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import ebpo_verl
from ebpo_verl.trainer.ray_trainer import SUM_PI_SQUARED, copied_compute_advantage, ebpo_trainer_cls

REPO = Path(__file__).resolve().parents[1]
OTB = ["algorithm.adv_estimator=optimal_token_baseline", "actor_rollout_ref.actor.calculate_sum_pi_squared=True"]


def test_response_slice_of_sum_pi_squared_matches_the_model_logits():
    """The actor's outputs as verl's FSDP engine lays them out (per position of each whole sequence, packed, cut by
    cu_seqlens; sum_pi_squared and log-probs from verl's own functions) for a random tiny causal LM; the slice the
    trainer stores must be, for response token j of a sequence with prompt length P, sum_v softmax(logits at
    P + j - 1)_v^2 recomputed here per sequence in float64, aligned with verl's slice of the log-probs (the
    log-probability of that very token)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from verl.utils import torch_functional as verl_F
    from verl.utils.torch_functional import logprobs_from_logits
    from verl.workers.utils.padding import response_from_nested

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=37, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    ).eval()
    prompts, responses = [3, 1, 5], [4, 2, 1]
    sequences = [torch.randint(0, 37, (p + r,)) for p, r in zip(prompts, responses, strict=True)]
    with torch.no_grad():
        logits = [model(seq[None]).logits[0] for seq in sequences]  # (P + R, V) each
    packed_logits = torch.cat(logits)
    rolled = torch.cat([torch.roll(seq, -1) for seq in sequences])  # label of position t: token t + 1
    cu = torch.tensor([0, *np.cumsum([len(s) for s in sequences])])
    spp_nested = torch.nested.nested_tensor_from_jagged(verl_F.calculate_sum_pi_squared_from_logits(packed_logits), cu)
    logp_nested = torch.nested.nested_tensor_from_jagged(logprobs_from_logits(packed_logits, rolled), cu)
    mask = torch.nested.as_nested_tensor([torch.ones(r, dtype=torch.int64) for r in responses], layout=torch.jagged)

    got = response_from_nested(spp_nested, mask).unbind()  # the trainer's slice (_compute_old_log_prob)
    logp = response_from_nested(logp_nested, mask).unbind()
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        probs = torch.softmax(logits[i].double(), dim=-1)
        expected = [float((probs[p + j - 1] ** 2).sum()) for j in range(r)]
        np.testing.assert_allclose(got[i].double().numpy(), expected, rtol=1e-5)
        token_logp = [math.log(float(probs[p + j - 1, sequences[i][p + j]])) for j in range(r)]
        np.testing.assert_allclose(logp[i].double().numpy(), token_logp, rtol=1e-5, atol=1e-6)


DIFFERENTIAL_CASES = {
    "grpo": ["algorithm.adv_estimator=grpo"],
    "grpo-kl-correction": [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=True",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_rs=token_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=1.3",
    ],
    "rloo-kl": ["algorithm.adv_estimator=rloo", "algorithm.use_kl_in_reward=True"],
    "ebpo-correction": ["algorithm.rollout_correction.rollout_is=sequence"],
}


@pytest.mark.slow
def test_copied_advantage_step_agrees_with_verls_own(ray_local, compose_config):
    """The same rows through verl's ``PPOTrainer._compute_advantage`` and through the OTB mixin's copy (without
    the extra field): every field written back (advantages, returns, KL-shaped rewards, the rejection-sampled
    mask, IS weights) and every metric agree exactly, with and without the KL penalty and the rollout correction
    (also for ebpo, whose options verl's method does not pass: the trainer's step inputs do)."""
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import PPOTrainer
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    gen = torch.Generator().manual_seed(1)
    lengths, uids = [2, 5, 3, 4, 1, 3, 2, 4], ["a"] * 4 + ["b"] * 4
    rows = []
    for uid, n in zip(uids, lengths, strict=True):
        old = -2 * torch.rand(n, generator=gen)
        rows.append(
            {
                "uid": uid,
                "response_mask": torch.ones(n, dtype=torch.int64),
                "rm_scores": torch.tensor([0.0] * (n - 1) + [float(torch.rand(1, generator=gen) < 0.5)]),
                "old_log_probs": old,
                "rollout_log_probs": old + 0.6 * (torch.rand(n, generator=gen) - 0.5),
                "ref_log_prob": old + 0.2 * (torch.rand(n, generator=gen) - 0.5),
            }
        )
    keys = [f"{uid}_{i}_0" for i, uid in enumerate(uids)]
    tags = [{"status": "success"} for _ in keys]
    fields = ["advantages", "returns", "token_level_rewards", "response_mask", "rollout_is_weights"]
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    try:
        for case, overrides in DIFFERENTIAL_CASES.items():
            config = compose_config("actor_rollout_ref.rollout.n=4", *overrides)
            results = []
            for method in ("verl", "copy"):
                trainer = ebpo_trainer_cls("sync")(config)
                ebpo_verl.get_state().reset()
                tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(rows), tags=tags)
                batch, metrics = KVBatchMeta(partition_id="train", keys=keys, tags=tags), {}
                if method == "verl":
                    PPOTrainer._compute_advantage(trainer, batch, metrics)
                else:
                    copied_compute_advantage(trainer, batch, metrics, {})
                out = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=fields)
                tq.kv_clear(keys=keys, partition_id="train")
                results.append(({k: [t.clone() for t in out[k].unbind()] for k in out.keys()}, metrics))
            (ours, our_metrics), (theirs, their_metrics) = results[1], results[0]
            assert sorted(ours) == sorted(theirs), case
            for name in theirs:
                for a, b in zip(ours[name], theirs[name], strict=True):
                    torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"{case}: {name}")
            assert our_metrics.keys() == their_metrics.keys(), case
            for name, value in their_metrics.items():
                np.testing.assert_equal(our_metrics[name], value, err_msg=f"{case}: {name}")
            if "use_kl_in_reward=True" in " ".join(overrides):
                assert "token_level_rewards" in theirs, case
            if "rollout_rs=token_k1" in " ".join(overrides):
                assert any((m == 0).any() for m in theirs["response_mask"]), case  # some tokens rejected
    finally:
        tq.close()


def _otb_by_hand(rewards, lengths, old_logp, spp, groups):
    """OTB in plain Python (arXiv 2602.07078 as verl 0.9.1 implements it): w_t = 1 - 2 pi_t + sum pi^2,
    W_t = w_1 + ... + w_t, B_t = sum_i G_i W_it / (sum_i W_it + 1e-8) over the responses still running at t, the
    unique longest response's baseline 0 past the second longest, A_t = G_t - B_t (G_t: the outcome reward)."""
    adv = [[0.0] * n for n in lengths]
    w_cum = []
    for i, n in enumerate(lengths):
        total, row = 0.0, []
        for t in range(n):
            total += 1.0 - 2.0 * math.exp(old_logp[i][t]) + spp[i][t]
            row.append(total)
        w_cum.append(row)
    for members in groups:
        by_length = sorted(lengths[i] for i in members)
        longest = [i for i in members if lengths[i] == by_length[-1]]
        for t in range(by_length[-1]):
            live = [i for i in members if t < lengths[i]]
            baseline = sum(rewards[i] * w_cum[i][t] for i in live) / (sum(w_cum[i][t] for i in live) + 1e-8)
            for i in live:
                tail = len(longest) == 1 and i == longest[0] and by_length[-1] > by_length[-2] and t >= by_length[-2]
                adv[i][t] = rewards[i] - (0.0 if tail else baseline)
    return adv


@pytest.mark.slow
def test_otb_advantage_step_through_transfer_queue(ray_local, compose_config):
    """Rows in TransferQueue as the trainer leaves them after the old-log-prob step (old_log_probs and the
    response part of sum_pi_squared) -> _compute_advantage -> OTB's advantages, equal to the hand formula."""
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from transfer_queue import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    config = compose_config("actor_rollout_ref.rollout.n=3", *OTB)
    trainer = ebpo_trainer_cls("sync")(config)
    assert trainer.otb
    gen = torch.Generator().manual_seed(0)
    rewards, lengths, uids = [0.0, 1.0, 1.0, 0.0, 1.0, 0.0], [1, 4, 2, 3, 3, 1], ["a"] * 3 + ["b"] * 3
    old_logp = [(-2 * torch.rand(n, generator=gen)).tolist() for n in lengths]
    spp = [(0.2 + 0.7 * torch.rand(n, generator=gen)).tolist() for n in lengths]
    rows = [
        {
            "uid": uid,
            "response_mask": torch.ones(n, dtype=torch.int64),
            "rm_scores": torch.tensor([0.0] * (n - 1) + [r]),
            "old_log_probs": torch.tensor(lp),
            SUM_PI_SQUARED: torch.tensor(s),
        }
        for uid, n, r, lp, s in zip(uids, lengths, rewards, old_logp, spp, strict=True)
    ]
    keys = [f"{uid}_{i}_0" for i, uid in enumerate(uids)]
    tags = [{"status": "success"} for _ in keys]
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    try:
        tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(rows), tags=tags)
        metrics: dict = {}
        trainer._compute_advantage(KVBatchMeta(partition_id="train", keys=keys, tags=tags), metrics)
        advantages = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages"])["advantages"]
        tq.kv_clear(keys=keys, partition_id="train")
    finally:
        tq.close()
    want = _otb_by_hand(rewards, lengths, old_logp, spp, [[0, 1, 2], [3, 4, 5]])
    for got, expected in zip(advantages.unbind(), want, strict=True):
        np.testing.assert_allclose(got.numpy(), expected, atol=1e-6)
    assert advantages.unbind()[1][2:].tolist() == [1.0, 1.0]  # the unique longest past the second: A = G
    flat = [x for row in spp for x in row]
    assert metrics["otb/sum_pi_squared_mean"] == pytest.approx(sum(flat) / len(flat), rel=1e-6)


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.skipif(os.environ.get("EBPO_SKIP_CPU_SMOKE") == "1", reason="EBPO_SKIP_CPU_SMOKE=1")
def test_otb_trains_through_verls_trainer_on_cpu(tmp_path):
    """Two steps of ``python -m ebpo_verl.main`` with verl's OTB on the CPU backend (the cpu_smoke setup: tiny
    Qwen3, 4 prompts x 4 samples, coin-flip reward). verl's OTB asserts that sum_pi_squared reached it, so the run
    finishing is the first check; the logged token mean of sum_pi_squared must lie in [1/V, 1] (V: the tiny
    model's vocabulary), every OTB advantage of a 0/1 reward in [-1, 1], and the metrics log's provenance must be
    complete."""
    from ebpo_verl.ops.metrics_log import read_metrics_log, read_provenance
    from ebpo_verl.ops.provenance import check
    from tests.harness.runs import train
    from tests.harness.settings import prepare

    files = prepare(tmp_path)
    extra = [*OTB, "trainer.save_freq=-1", "trainer.test_freq=-1"]
    train(tmp_path, files, "otb", extra, timeout=900, steps=2)
    log = tmp_path / "ckpt_otb" / "metrics.jsonl"
    metrics = read_metrics_log(log)
    assert sorted(metrics) == [1, 2]
    vocab = json.loads((files["model"] / "config.json").read_text())["vocab_size"]
    for step, data in metrics.items():
        spp = data["otb/sum_pi_squared_mean"]
        assert 1 / vocab <= spp <= 1, (step, spp)
        assert -1 - 1e-6 <= data["critic/advantages/min"] <= data["critic/advantages/max"] <= 1 + 1e-6, step
        assert data["actor/grad_norm"] > 0, step
    (attempt,) = read_provenance(log)
    record = check(attempt["provenance"], str(log))
    # the driver's argv (python -m runs the module by its path) with the overrides
    assert "ebpo_verl/main.py" in record["command"] and "adv_estimator=optimal_token_baseline" in record["command"]
    assert record["seed"]["rollout"] is not None
