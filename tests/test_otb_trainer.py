"""verl's Optimal Token Baseline through the package's v1 trainer (verl 0.9.1's v1 trainer alone never asks the
actor for the sum of squared token probabilities nor passes it to the estimator; ebpo_verl.trainer does both).

The advantage step is checked against OTB's formula by hand through TransferQueue; the end-to-end run trains two
steps with ``algorithm.adv_estimator=optimal_token_baseline`` on the CPU backend."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

import ebpo_verl
from ebpo_verl.trainer import SUM_PI_SQUARED, ebpo_trainer_cls

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(Path(ebpo_verl.__file__).parent / "config")
OTB = ["algorithm.adv_estimator=optimal_token_baseline", "actor_rollout_ref.actor.calculate_sum_pi_squared=True"]


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
def test_otb_advantage_step_through_transfer_queue(ray_local):
    """Rows in TransferQueue as the trainer leaves them after the old-log-prob step (old_log_probs and the
    response part of sum_pi_squared) -> _compute_advantage -> OTB's advantages, equal to the hand formula."""
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from transfer_queue import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = compose("ebpo_trainer", overrides=["actor_rollout_ref.rollout.n=3", *OTB])
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
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import cpu_smoke
    finally:
        sys.path.remove(str(REPO / "scripts"))
    from ebpo_verl.metrics_log import read_metrics_log, read_provenance
    from ebpo_verl.provenance import check

    files = cpu_smoke.prepare(tmp_path)
    extra = [*OTB, "trainer.save_freq=-1", "trainer.test_freq=-1"]
    cpu_smoke.train(tmp_path, files, "otb", extra, timeout=900, steps=2)
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
