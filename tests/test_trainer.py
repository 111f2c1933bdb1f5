"""The EBPO trainer: cluster labels from real data reaching the estimator, the advantage step through
TransferQueue, the training-data label check, and the ``ebpo`` registration inside the TaskRunner actor."""

from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from verl.protocol import DataProto

import ebpo_verl
from ebpo_verl.algos import registry
from ebpo_verl.data import dapo_math, math500
from ebpo_verl.ops.errors import EBPOConfigError
from ebpo_verl.options.parsing import OptionSection
from ebpo_verl.trainer.adapter import advantage_step
from ebpo_verl.trainer.preflight.data import check_row_labels
from ebpo_verl.trainer.ray_trainer import ebpo_trainer_cls, extra_info_values

GROUP = 4
CLUSTER_KEY = "algorithm.ebpo.cluster_key"


def _estimate(trainer, data, row_values) -> dict:
    """The trainer's estimator on ``data`` with the step's per-row values, as its advantage step calls it; the
    metrics."""
    data.batch["advantages"], data.batch["returns"], metrics = advantage_step(data, trainer.estimator, row_values)
    return metrics


@pytest.fixture
def _config(compose_config):
    """``_config(*overrides)``: a run's config with groups of GROUP (tests/conftest.py's composer)."""

    def composed(*overrides: str):
        return compose_config(f"actor_rollout_ref.rollout.n={GROUP}", *overrides)

    return composed


def _trainer_on(_config, parquet: Path, tokenizer, *overrides: str):
    config = _config(
        f"data.train_files={parquet}",
        f"data.val_files={parquet}",
        "data.train_batch_size=16",
        "data.dataloader_num_workers=0",
        *overrides,
    )
    trainer = ebpo_trainer_cls("sync")(config)
    trainer.tokenizer, trainer.processor = tokenizer, None
    return trainer


@pytest.fixture(scope="module")
def math500_parquet(hub_data, tmp_path_factory) -> Path:
    return math500.prepare(tmp_path_factory.mktemp("data"), local_path=hub_data / "math500.jsonl")


def test_trainer_row_values_skip_padding_and_name_unlabelled_rows():
    infos = [{"topic": "algebra"}, {"topic": "geometry"}, {"topic": "algebra"}, {"index": 3}]
    got = extra_info_values(infos[:3], ["u1", "u2", "pad9"], [False, False, False], "topic", CLUSTER_KEY)
    assert got.tolist() == ["algebra", "geometry", None]
    assert extra_info_values(infos[:2], ["u1", "u2"], [False, True], "topic", CLUSTER_KEY).tolist() == ["algebra", None]
    with pytest.raises(EBPOConfigError, match=r"uid u4 has no extra_info\['topic'\].*keys: \['index'\]"):
        extra_info_values(infos, ["u1", "u2", "u3", "u4"], [False] * 4, "topic", CLUSTER_KEY)
    with pytest.raises(
        EBPOConfigError, match=r"^uid u1 carries more than one extra_info\['topic'\] .*'algebra', 'geometry'$"
    ):
        extra_info_values([infos[0], infos[1], infos[1]], ["u1", "u2", "u1"], [False] * 3, "topic", CLUSTER_KEY)
    with pytest.raises(EBPOConfigError, match=r"^uid 1 carries more than one .*: 1, 1.0$"):  # compared as text
        extra_info_values([{"topic": 1}, {"topic": 1.0}], ["1", 1], [False] * 2, "topic", CLUSTER_KEY)
    nan_pad = extra_info_values([{"topic": "a"}, {"topic": float("nan")}], ["u1", "pad0"], [False] * 2, "topic", "k")
    assert nan_pad.tolist() == ["a", None]


def test_trainer_labels_from_rlhf_dataset_reach_the_estimator(math500_parquet, hub_data, tiny_tokenizer, _config):
    """A batch of the prepared MATH-500 parquet through verl's dataset/dataloader; expected clusters from the source."""
    trainer = _trainer_on(
        _config,
        math500_parquet,
        tiny_tokenizer,
        "algorithm.ebpo.cluster_key=topic",
        "algorithm.ebpo.min_cluster_prompts=0",
        "algorithm.ebpo.shrinkage=1.0",
        "algorithm.ebpo.norm=none",
    )
    trainer._init_dataloader()  # includes the label check on the whole training set
    batch = DataProto.from_single_dict(next(iter(trainer.train_dataloader)))
    batch.non_tensor_batch["uid"] = np.array([f"q{i}" for i in range(len(batch))], dtype=object)
    batch = batch.repeat(GROUP, interleave=True)
    n = len(batch)
    rewards = torch.tensor([float((i * 7) % 3 == 0) for i in range(n)])
    lengths = torch.tensor([1 + (i % 5) for i in range(n)])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).float()
    token_rewards = torch.zeros(n, 6)
    token_rewards[torch.arange(n), lengths - 1] = rewards
    uids = batch.non_tensor_batch["uid"]
    data = DataProto.from_dict(
        tensors={"token_level_rewards": token_rewards, "response_mask": mask}, non_tensors={"uid": uids}
    )
    row_keys = extra_info_values(batch.non_tensor_batch["extra_info"], uids, [False] * n, "topic", CLUSTER_KEY)

    ebpo_verl.get_state().reset()
    diagnostics = _estimate(trainer, data, row_keys)

    source = [json.loads(line) for line in (hub_data / "math500.jsonl").read_text().splitlines()]
    subject = np.array([source[info["index"]]["subject"] for info in batch.non_tensor_batch["extra_info"]])
    assert len(set(subject)) >= 2
    for name in set(subject):
        in_cluster = torch.from_numpy(subject == name)
        mean = rewards[in_cluster].double().mean().item()
        assert diagnostics[f"ebpo/cluster/{name}/mu_glob"] == pytest.approx(mean, abs=1e-12)
        # shrinkage 1, no normalisation: A_i = r_i - (mean reward of the prompt's subject), on every response token
        expected = (rewards[in_cluster] - mean)[:, None] * mask[in_cluster]
        torch.testing.assert_close(data.batch["advantages"][in_cluster], expected, atol=1e-6, rtol=0)
    assert diagnostics["ebpo/prompts_seen"] == n / GROUP


def test_trainer_dataset_check_lists_keys_and_unlabelled_rows(
    math500_parquet, hub_data, tiny_tokenizer, tmp_path, _config
):
    wrong_key = _trainer_on(_config, math500_parquet, tiny_tokenizer, "algorithm.ebpo.cluster_key=subject")
    with pytest.raises(EBPOConfigError) as err:
        wrong_key._init_dataloader()
    assert "cluster_key='subject' is not a key of extra_info" in str(err.value)
    assert "['difficulty', 'index', 'raw_answer', 'raw_problem', 'source_id', 'split', 'topic']" in str(err.value)
    assert str(math500_parquet) in str(err.value)

    dapo = dapo_math.prepare(tmp_path, local_path=hub_data / "dapo_math_sample.jsonl")  # no topics
    n = pq.read_metadata(dapo).num_rows
    unlabelled = _trainer_on(_config, dapo, tiny_tokenizer, "algorithm.ebpo.cluster_key=topic")
    with pytest.raises(
        EBPOConfigError,
        match=rf"extra_info\['topic'\] \({CLUSTER_KEY}\) is missing or null in {n} of {n} training rows",
    ):
        unlabelled._init_dataloader()

    with pytest.raises(EBPOConfigError, match=r"in 1 of 3 training rows .* first rows: \[1\]"):
        check_row_labels([{"topic": "a"}, None, {"topic": "b"}], "topic", "x.parquet", registry.get("ebpo"))


@pytest.mark.slow
def test_trainer_registration_visible_in_the_task_runner_actor(ray_local, _config):
    from ebpo_verl.trainer.ray_trainer import EBPOTaskRunner

    def probe(_runner):
        from verl.trainer.ppo import core_algos

        return os.getpid(), core_algos.get_adv_estimator_fn("ebpo").__module__

    runner = EBPOTaskRunner.remote()
    options = ray_local.get(runner.preflight.remote(_config("algorithm.ebpo.shrinkage=0.5")))
    assert options.estimator.fixed_shrinkage == 0.5  # the TaskRunner's own parse, handed to its trainer
    pid, module = ray_local.get(runner.__ray_call__.remote(probe))
    assert pid != os.getpid() and module == "ebpo_verl.trainer.adapter"
    with pytest.raises(EBPOConfigError, match="algorithm.ebpo.prior='laplace' is invalid"):
        ray_local.get(runner.preflight.remote(_config("algorithm.ebpo.prior=laplace")))


@pytest.mark.slow
def test_trainer_advantage_step_through_transfer_queue(ray_local, _config):
    """verl's v1 flow: rows in TransferQueue (as the agent loop writes them) -> _compute_advantage -> advantages."""
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from transfer_queue import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    try:
        config = _config(
            "algorithm.ebpo.cluster_key=topic",
            "algorithm.ebpo.min_cluster_prompts=0",
            "algorithm.ebpo.shrinkage=1.0",
            "algorithm.ebpo.norm=none",
        )
        trainer = ebpo_trainer_cls("sync")(config)
        topics = {"p0": "algebra", "p1": "geometry", "p2": "algebra"}
        scores = {"p0": [1, 1, 0, 1], "p1": [0, 0, 1, 0], "p2": [0, 1, 0, 0]}
        keys, rows, tags = [], [], []
        for uid, topic in topics.items():
            for session, score in enumerate(scores[uid]):
                length = 2 + session
                keys.append(f"{uid}_{session}_0")
                rows.append(
                    {
                        "uid": uid,
                        "response_mask": torch.ones(length, dtype=torch.int64),
                        "rm_scores": torch.tensor([0.0] * (length - 1) + [float(score)]),
                        "extra_info": {"topic": topic, "index": int(uid[1])},
                    }
                )
                tags.append({"status": "success"})
        keys.append("padfeed_0_0")  # verl's padding row: copies a real row's fields, zero mask and reward
        rows.append({**rows[4], "uid": "padfeed", "response_mask": torch.zeros(1, dtype=torch.int64)})
        rows[-1]["rm_scores"] = torch.zeros(1)
        tags.append({"status": "success", "is_padding": True})
        tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(rows), tags=tags)

        metrics: dict = {}
        ebpo_verl.get_state().reset()
        no_parse = AssertionError("the step parsed options: it must read the trainer's")
        with mock.patch.object(OptionSection, "from_mapping", side_effect=no_parse):
            trainer._compute_advantage(KVBatchMeta(partition_id="train", keys=keys, tags=tags), metrics)
        out = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages", "returns"])
        advantages, returns = out["advantages"].unbind(), out["returns"].unbind()
        tq.kv_clear(keys=keys, partition_id="train")

        # bnpo: the trainer's own bnpo object; its bnpo/* diagnostics reach the metrics too
        tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(rows), tags=tags)
        bnpo_metrics: dict = {}
        bnpo_trainer = ebpo_trainer_cls("sync")(_config("algorithm.adv_estimator=bnpo"))
        bnpo_trainer._compute_advantage(KVBatchMeta(partition_id="train", keys=keys, tags=tags), bnpo_metrics)
        bnpo_adv = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages"])["advantages"]
        tq.kv_clear(keys=keys, partition_id="train")
    finally:
        tq.close()
    largest = max(abs(a[0].item()) for a in bnpo_adv.unbind())
    assert largest > 0 and bnpo_metrics["bnpo/max_abs_adv"] == pytest.approx(largest, rel=1e-6)

    algebra = np.mean(scores["p0"] + scores["p2"])  # 4/8
    geometry = np.mean(scores["p1"])  # 1/4
    row = 0
    for uid, topic in topics.items():
        for session, score in enumerate(scores[uid]):
            expected = score - (algebra if topic == "algebra" else geometry)
            assert advantages[row].tolist() == pytest.approx([expected] * (2 + session), abs=1e-6)
            row += 1
    assert advantages[row].tolist() == [0.0]  # padding row
    assert metrics["ebpo/cluster/algebra/mu_glob"] == pytest.approx(0.5)
    assert metrics["ebpo/cluster/geometry/mu_glob"] == pytest.approx(0.25)
    assert metrics["ebpo/prompts_seen"] == 3 and metrics["ebpo/responses_seen"] == 12
    expected_keys = {"shrinkage_mean", "shrinkage_min", "shrinkage_max", "mu_glob", "sigma2", "tau2", "prompts_seen"}
    expected_keys |= {"frac_zero_var_groups", "frac_all_fail", "frac_all_pass"}
    assert {f"ebpo/{k}" for k in expected_keys} <= set(metrics)
    for adv, ret in zip(advantages, returns, strict=True):
        torch.testing.assert_close(ret, adv)
