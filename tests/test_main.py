"""Entry point: config composition on top of the installed verl config, and the driver-side pre-flight checks."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir, initialize_config_module
from omegaconf import OmegaConf

import ebpo_verl
from ebpo_verl.estimator import EBPOOptions
from ebpo_verl.validation import EBPOConfigError, check_config

CONFIG_DIR = str(Path(ebpo_verl.__file__).parent / "config")
REPO = Path(__file__).resolve().parents[1]


def _ours(*overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("ebpo_trainer", overrides=list(overrides))


def _leaves(node, prefix: str = "") -> dict[str, object]:
    if isinstance(node, dict):
        out: dict[str, object] = {}
        for key, value in node.items():
            out.update(_leaves(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def test_main_config_is_verl_ppo_trainer_plus_only_the_ebpo_deltas():
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        verl_cfg = _leaves(OmegaConf.to_container(compose("ppo_trainer"), resolve=False))
    ours_cfg = _ours()
    ours = _leaves(OmegaConf.to_container(ours_cfg, resolve=False))

    assert set(verl_cfg) - set(ours) == set()
    changed = {key for key in ours if key not in verl_cfg or ours[key] != verl_cfg[key]}
    defaults = dataclasses.asdict(EBPOOptions())
    assert changed == {
        "algorithm.adv_estimator",
        *(f"algorithm.ebpo.{key}" for key in defaults),
        "reward.custom_reward_function.path",
        "trainer.metrics_log_path",
    }
    assert ours_cfg.algorithm.adv_estimator == "ebpo"
    assert OmegaConf.to_container(ours_cfg.algorithm.ebpo) == defaults
    assert ours_cfg.reward.custom_reward_function.path == "pkg://ebpo_verl.reward"
    assert ours_cfg.reward.custom_reward_function.name == "compute_score"
    assert ours_cfg.trainer.metrics_log_path == f"{ours_cfg.trainer.default_local_dir}/metrics.jsonl"


def test_main_overrides_reach_the_options():
    config = _ours(
        "algorithm.ebpo.shrinkage=0.25",
        "algorithm.ebpo.cluster_key=topic",
        "algorithm.ebpo.prior=beta_binomial",
        "actor_rollout_ref.rollout.n=1",
    )
    options = check_config(config)
    assert options == EBPOOptions(shrinkage=0.25, cluster_key="topic", prior="beta_binomial")
    assert check_config(_ours("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1")) is None


CURRICULUM = ["data.custom_cls.path=pkg://ebpo_verl.curriculum", "data.custom_cls.name=CurriculumDataset"]
ERRORS = {
    "group-size": (["actor_rollout_ref.rollout.n=1"], "rollout.n=1 but algorithm.ebpo.shrinkage=auto needs at least 2"),
    "unknown-key": (
        ["actor_rollout_ref.rollout.n=4", "+algorithm.ebpo.shrinkage_floor=0.1"],
        "unknown algorithm.ebpo option(s) ['shrinkage_floor']; valid keys: ['prior', 'stats_scope', 'sigma2'",
    ),
    "bad-value": (["actor_rollout_ref.rollout.n=4", "algorithm.ebpo.prior=laplace"], "algorithm.ebpo.prior='laplace'"),
    "bad-decay": (["actor_rollout_ref.rollout.n=4", "algorithm.ebpo.decay=0"], "algorithm.ebpo.decay=0"),
    "legacy-trainer": (["actor_rollout_ref.rollout.n=4", "trainer.use_v1=false"], "trainer.use_v1=false"),
    "curriculum-shuffle": (
        ["actor_rollout_ref.rollout.n=4", *CURRICULUM, "+data.curriculum.order=topic", "data.shuffle=true"],
        "data.curriculum.order=topic needs data.shuffle=False",
    ),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_main_check_config_errors(case):
    overrides, message = ERRORS[case]
    with pytest.raises(EBPOConfigError) as err:
        check_config(_ours(*overrides))
    assert message in str(err.value)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "ebpo_verl.main", *args], capture_output=True, text=True, timeout=300, cwd=REPO, env=env
    )


def test_main_cli_prints_config_and_rejects_bad_config_without_ray(tmp_path):
    shown = _cli("--cfg", "job", "algorithm.ebpo.cluster_key=topic", "actor_rollout_ref.rollout.n=8")
    assert shown.returncode == 0, shown.stderr
    config = yaml.safe_load(shown.stdout)
    assert config["algorithm"]["adv_estimator"] == "ebpo"
    assert config["algorithm"]["ebpo"]["cluster_key"] == "topic"
    assert config["actor_rollout_ref"]["rollout"]["n"] == 8
    assert config["data"]["train_batch_size"] == 1024  # verl's own default, untouched

    bad = _cli("actor_rollout_ref.rollout.n=1", f"hydra.run.dir={tmp_path}")
    assert bad.returncode == 2
    assert "ebpo-train: error: actor_rollout_ref.rollout.n=1" in bad.stderr
    assert "ray" not in (bad.stdout + bad.stderr).lower()


def test_main_check_registered_reports_a_missing_estimator(monkeypatch):
    from verl.trainer.ppo import core_algos

    from ebpo_verl.validation import check_registered

    check_registered()
    monkeypatch.setattr(ebpo_verl, "register", lambda: None)  # as if verl's plugin loader had failed silently
    monkeypatch.setattr(core_algos, "ADV_ESTIMATOR_REGISTRY", {})
    with pytest.raises(EBPOConfigError, match=r"'ebpo' is not registered in the TaskRunner process \(pid \d+"):
        check_registered()
