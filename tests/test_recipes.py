"""recipe/ebpo: the shell recipes compose into the configs the paper and the baselines call for (CPU only).

Composition through the entry point costs seconds per process, so the ALGO x BASELINES x REWARD matrix is checked
by letting the shell print its Hydra overrides (PRINT_OVERRIDES=1, a bash process) and composing them in-process
with Hydra's compose API on the package config, then running the package's own pre-flight
(``ebpo_verl.validation.preflight``: our checks + verl's ``validate_config`` at the configured world size) on
each; a few real ``DRY_RUN=1`` subprocesses check the same path end to end (and its refusals: zero steps per
epoch, world size), and one of them is compared with the in-process composition of the same overrides.
Expected values are written from the paper (docs/paper_notes.md#setup), the authors' runs as #authors-runs reports
them (BASELINES=paper) and the baselines' own definitions (BASELINES=canonical), not read from the scripts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipe" / "ebpo"
SCRIPTS = sorted(RECIPE.glob("*.sh"))
RUN_SCRIPTS = ["run_qwen3_8b.sh", "run_qwen3_14b.sh", "run_llama3_8b.sh"]
TABLES = ["main", "group_size", "ordering", "curriculum", "grpo_bn"]
MODELS = {"qwen3_8b": "Qwen/Qwen3-8B", "qwen3_14b": "Qwen/Qwen3-14B", "llama3_8b": "meta-llama/Llama-3.1-8B-Instruct"}
ALGOS = [
    "ebpo", "ebpo_bb", "ebpo_batch", "grpo", "grpo_bn", "drgrpo", "dapo", "entropy_mech", "rloo", "reinforce_pp",
    "spo", "bnpo", "js",
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
    "js": {"algorithm.adv_estimator": "shrinkage_js"},
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
    "data.custom_cls.path": "pkg://ebpo_verl.curriculum",
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


def recipe_env(work: Path, **extra: str) -> dict[str, str]:
    """A clean environment for the recipes: no ALGO/ORDER/... leaking in from the caller."""
    env = {"PATH": os.environ["PATH"], "HOME": str(work), "WORK_DIR": str(work), "PYTHON": sys.executable}
    env.update(extra)
    return env


def run_recipe(script: str, work: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(RECIPE / script), *args], env=recipe_env(work, **env), capture_output=True, text=True
    )


def overrides(script: str, work: Path, *args: str, **env: str) -> list[str]:
    result = run_recipe(script, work, *args, PRINT_OVERRIDES="1", **env)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def select(cfg, key: str):
    value = OmegaConf.select(cfg, key, throw_on_missing=True)
    return OmegaConf.to_object(value) if OmegaConf.is_config(value) else value


@pytest.fixture(scope="module")
def compose():
    """Compose the package config (ebpo_verl/config/ebpo_trainer.yaml) in-process with a list of overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()  # in case another test left Hydra initialised
    with initialize_config_module(config_module="ebpo_verl.config", version_base=None):
        yield lambda ovr: hydra_compose("ebpo_trainer", overrides=ovr)


def test_scripts_parse_and_pass_shellcheck():
    names = {p.name for p in SCRIPTS}
    expected = {"common.sh", "eval.sh", *RUN_SCRIPTS, *(f"table_{t}.sh" for t in TABLES)}
    assert expected <= names
    for script in SCRIPTS:
        subprocess.run(["bash", "-n", str(script)], check=True)
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
    result = subprocess.run([shellcheck, "-x", *map(str, SCRIPTS)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("baselines", ["paper", "canonical"])
def test_every_algo_baselines_and_reward_composes_with_the_methods_values(compose, tmp_path, baselines):
    """ALGO x REWARD for one BASELINES: the keys that define each method, the shared setup, the experiment name,
    verl's registries and the package's pre-flight (our checks + verl's validate_config at 4 x 8 GPUs)."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn

    import ebpo_verl
    from ebpo_verl.validation import preflight

    ebpo_verl.register()  # ebpo, and the fork's spo / bnpo / shrinkage_js (ebpo_verl.baselines)
    for algo in ALGOS:
        for reward in ("paper", "math_verify"):
            cfg = compose(overrides("run_qwen3_8b.sh", tmp_path, ALGO=algo, BASELINES=baselines, REWARD=reward))
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
            lines = preflight(cfg, dry_run=True)
            assert lines[0] == "world size 32"


def test_keys_kept_for_fidelity_are_inert_in_verl():
    """clip_ratio_c (EntropyMech's 10) is not read by verl 0.9.1's clip_cov loss, and algorithm.kl_ctrl only
    with use_kl_in_reward=True (False in every preset): the recipes set them as the authors' scripts did, and
    the README says they change nothing. If verl starts reading them, this fails and the README must change."""
    import inspect

    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1 import trainer_base

    import ebpo_verl.trainer

    assert "clip_ratio_c" not in inspect.getsource(core_algos.compute_policy_loss_clip_cov)
    assert "clip_ratio_c" in inspect.getsource(core_algos.compute_policy_loss_vanilla)  # the shared c 3 is read
    for module in (trainer_base, ebpo_verl.trainer):
        lines = inspect.getsource(module).splitlines()
        uses = [i for i, line in enumerate(lines) if "kl_ctrl" in line and not line.lstrip().startswith("#")]
        assert uses, module.__name__
        for i in uses:  # every use is a statement opened within 3 lines of an `if ...use_kl_in_reward:`
            guard = [x.strip() for x in lines[max(0, i - 3) : i]]
            assert any(g.startswith("if ") and g.endswith("use_kl_in_reward:") for g in guard), (module, lines[i])


def test_orders_pick_their_training_file_and_epochs(compose, tmp_path):
    for order in ORDERS:
        cfg = compose(overrides("run_qwen3_8b.sh", tmp_path, ORDER=order))
        expect = {
            **ORDER_EXPECT[order],
            "data.train_files": [f"{tmp_path}/data/{TRAIN_FILE[order]}"],
            "trainer.total_epochs": 1 if order == "difficulty" else 3,
            "trainer.experiment_name": f"qwen3_8b-ebpo-g4-{order}-rw_paper-bl_paper",
        }
        assert {key: select(cfg, key) for key in expect} == expect, order


def test_presets_pass_verl_validation_and_use_registered_managers(compose, tmp_path):
    """verl's own validate_config (batch sizes vs GPUs, loss modes, ...) on the Qwen3-14B layout."""
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.trainer.ppo.utils import need_reference_policy

    from ebpo_verl.validation import check_verl_config

    # the 8B layout of every preset passed the full pre-flight above; here the presets that change the reward
    # manager, the policy loss or the reference policy, on the 14B layout (rollout TP 2, optimizer offload)
    for algo, baselines in [("ebpo", "paper"), ("dapo", "canonical"), ("entropy_mech", "paper"), ("spo", "paper")]:
        cfg = compose(overrides("run_qwen3_14b.sh", tmp_path, ALGO=algo, BASELINES=baselines))
        assert cfg.reward.reward_manager.name in REWARD_MANAGER
        assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
        assert need_reference_policy(cfg) == bool(cfg.actor_rollout_ref.actor.use_kl_loss)
        check_verl_config(cfg)


def test_group_size_env_and_extra_arguments_pass_through(compose, tmp_path):
    ovr = overrides(
        "run_llama3_8b.sh", tmp_path, "algorithm.adv_estimator=grpo", "trainer.save_freq=3", GROUP_SIZE="16"
    )
    cfg = compose(ovr)
    assert cfg.actor_rollout_ref.rollout.n == 16
    assert cfg.algorithm.adv_estimator == "grpo"  # extra arguments come last and win
    assert cfg.trainer.save_freq == 3
    assert cfg.trainer.experiment_name == "llama3_8b-ebpo-g16-topic-rw_paper-bl_paper"
    assert cfg.actor_rollout_ref.model.path == MODELS["llama3_8b"]
    env = {"EXPERIMENT": "mine", "TOTAL_STEPS": "7", "ORDER": "naive", "KEEP_CKPTS": "5"}
    cfg = compose(overrides("run_qwen3_8b.sh", tmp_path, **env, VAL_SETS="aime2024,amc23", VAL_N="8"))
    assert cfg.trainer.experiment_name == "mine" and cfg.trainer.total_training_steps == 7
    assert cfg.trainer.total_epochs == 7  # never the limit: every epoch has at least one step
    assert cfg.trainer.max_actor_ckpt_to_keep == 5
    assert cfg.trainer.metrics_log_path == f"{tmp_path}/logs/mine/metrics.jsonl"
    assert list(cfg.data.val_files) == [f"{tmp_path}/data/aime2024.parquet", f"{tmp_path}/data/amc23.parquet"]
    assert cfg.actor_rollout_ref.rollout.val_kwargs.n == 8
    cfg = compose(overrides("run_qwen3_8b.sh", tmp_path, ALGO="spo", GROUP_SIZE="1"))  # single-stream SPO
    assert cfg.actor_rollout_ref.rollout.n == 1 and cfg.algorithm.adv_estimator == "spo"


BAD_ENV = [
    ({"GROUP_SIZE": "0"}, "GROUP_SIZE=0 is not an integer >= 2"),
    ({"GROUP_SIZE": "-4"}, "GROUP_SIZE=-4 is not an integer >= 2"),
    ({"GROUP_SIZE": "abc"}, "GROUP_SIZE=abc is not an integer >= 2"),
    ({"GROUP_SIZE": "1"}, "GROUP_SIZE=1 is not an integer >= 2"),
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


def test_bad_switches_fail_with_one_line_and_status_2(tmp_path):
    for env, words in BAD_ENV:
        result = run_recipe("run_qwen3_8b.sh", tmp_path, PRINT_OVERRIDES="1", **env)
        assert result.returncode == 2 and result.stdout == "", env
        assert result.stderr.count("\n") == 1 and words in result.stderr, (env, result.stderr)
    assert not (tmp_path / "data").exists() and not (tmp_path / "logs").exists()
    for env, words in [({"REWARD": "x"}, "unknown REWARD=x"), ({"EVAL_PROTOCOL": "vllm"}, "unknown EVAL_PROTOCOL")]:
        result = run_recipe("table_main.sh", tmp_path, "--list", **env)
        assert result.returncode == 2 and result.stderr.count("\n") == 1 and words in result.stderr
    own = overrides("run_qwen3_8b.sh", tmp_path, TOPICS="file", TRAIN_FILE="/d/gpt_topics.parquet")
    assert "data.train_files=['/d/gpt_topics.parquet']" in own and "++data.curriculum.order=topic" in own
    assert overrides("run_qwen3_8b.sh", tmp_path, TEST_FREQ="-1").count("trainer.test_freq=-1") == 1


def test_help_prints_the_header_and_does_nothing_else(tmp_path):
    """--help / -h of every run script and table driver: usage from the header comment, exit 0, no Python,
    no file written, even with bad settings in the environment."""
    calls = tmp_path / "python_calls"
    fake = tmp_path / "fake_python"
    fake.write_text(f'#!/usr/bin/env bash\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    work = tmp_path / "work"
    scripts = RUN_SCRIPTS + [f"table_{t}.sh" for t in TABLES]
    for script in scripts:
        header = (RECIPE / script).read_text().splitlines()[1].removeprefix("# ")
        for flag in ("--help", "-h"):
            result = run_recipe(script, work, flag, PYTHON=str(fake), GROUP_SIZE="abc", DRY_RUN="1")
            assert result.returncode == 0 and result.stderr == "", (script, result.stderr)
            assert result.stdout.splitlines()[0] == header
            section = "Switches (environment variables" if script.startswith("run_") else "Table drivers ("
            assert section in result.stdout and "REWARD" in result.stdout
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


def test_dry_run_runs_the_preflight_and_refuses_what_a_run_would(compose, tmp_path):
    """DRY_RUN through the real entry point, in parallel: each run script composes, runs the pre-flight and says
    so, prepares and writes nothing; a training file smaller than one batch (the 44-row DAPO sample) and a
    world size that does not divide the batch are refused with one line and status 2."""
    tiny = small_parquet(tmp_path / "sample.parquet", 44)
    runs = {
        "run_qwen3_14b.sh": (["trainer.test_freq=2"], {}),
        "zero_steps": ([], {"ORDER": "naive", "TRAIN_FILE": str(tiny)}),
        "world_size": ([f"{ACTOR}.use_dynamic_bsz=False"], {"NNODES": "1", "GPUS_PER_NODE": "3"}),
    }
    procs = {
        name: subprocess.Popen(
            ["bash", str(RECIPE / (name if name.endswith(".sh") else "run_qwen3_8b.sh")), *args],
            env=recipe_env(tmp_path / "work", DRY_RUN="1", ALGO="dapo", **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (args, env) in runs.items()
    }
    outputs = {name: proc.communicate(timeout=600) for name, proc in procs.items()}
    out, err = outputs["run_qwen3_14b.sh"]
    assert procs["run_qwen3_14b.sh"].returncode == 0, err[-3000:]
    assert "would prepare data" in err and "data_prep.all" in err
    assert "pre-flight: ok (world size 32" in err and "DRY_RUN: pre-flight passed" in err
    assert not (tmp_path / "work").exists()  # DRY_RUN prepares and writes nothing
    config = yaml.safe_load(out)
    assert config["actor_rollout_ref"]["model"]["path"] == MODELS["qwen3_14b"]
    assert config["trainer"]["test_freq"] == 2
    # the in-process composition of the printed overrides is the same config as the real dry run
    same = compose(overrides("run_qwen3_14b.sh", tmp_path / "work", "trainer.test_freq=2", ALGO="dapo"))
    assert OmegaConf.to_container(same) == config

    errors = {name: outputs[name][1].splitlines()[-1] for name in ("zero_steps", "world_size")}
    assert procs["zero_steps"].returncode == 2 and outputs["zero_steps"][0] == ""
    assert errors["zero_steps"].startswith("ebpo-train: error: one epoch would train 0 steps")
    assert f"{tiny}: 44 rows" in errors["zero_steps"] and "data.train_batch_size=512" in errors["zero_steps"]
    assert procs["world_size"].returncode == 2 and outputs["world_size"][0] == ""
    assert errors["world_size"].startswith("ebpo-train: error: verl's validate_config refused the config at world")
    assert "world size 3 (trainer.nnodes=1 x trainer.n_gpus_per_node=3)" in errors["world_size"]
    assert "real_train_batch_size (2048) must be divisible by minimal possible batch size (3)" in errors["world_size"]
    for name in ("zero_steps", "world_size"):
        assert "pre-flight passed" not in outputs[name][1]


def test_missing_data_is_prepared_in_order(tmp_path):
    """Without DRY_RUN the recipe runs data_prep.all, then the topic labelling, then the trainer."""
    log = tmp_path / "calls.txt"
    fake = tmp_path / "fake_python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$1 $2" >> {log}\n'
        "if [[ $2 == data_prep.all ]]; then for n in dapo_math math500 aime2024 aime2025 amc23 olympiadbench; do "
        'touch "$4/$n.parquet"; done; fi\n'
        'if [[ $2 == data_prep.label_topics ]]; then touch "$6"; fi\n'
    )
    fake.chmod(0o755)
    (tmp_path / "data").mkdir()
    env = recipe_env(tmp_path, PYTHON=str(fake))
    subprocess.run(["bash", str(RECIPE / "run_qwen3_8b.sh")], env=env, check=True, capture_output=True)
    assert log.read_text().splitlines() == ["-m data_prep.all", "-m data_prep.label_topics", "-m ebpo_verl.main"]
    assert (tmp_path / "logs" / "qwen3_8b-ebpo-g4-topic-rw_paper-bl_paper").is_dir()
    log.unlink()  # everything is there now: straight to training
    subprocess.run(["bash", str(RECIPE / "run_qwen3_8b.sh")], env=env, check=True, capture_output=True)
    assert log.read_text().splitlines() == ["-m ebpo_verl.main"]


FAKE_PYTHON = r"""#!/usr/bin/env bash
# Stands in for the GPU steps: `-m ebpo_verl.main` (training: a checkpoint and a metrics log) and
# `-m ebpo_verl.evaluate` (generate: a generations file; grade: a RESULTS.json); records every call.
case "$1 $2" in
  "-m ebpo_verl.main") ;;
  "-m ebpo_verl.evaluate") ;;
  *) exec "$REAL_PYTHON" "$@" ;;
esac
for a in "$@"; do
  case $a in
    trainer.experiment_name=*) name=${a#*=} ;;
    trainer.metrics_log_path=*) mlog=${a#*=} ;;
    trainer.default_local_dir=*) ckpt=${a#*=} ;;
    trainer.total_training_steps=*) steps=${a#*=} ;;
  esac
done
if [[ $2 == ebpo_verl.main && $3 == --cfg ]]; then
  echo "preflight $name" >> "$CALLS"
  exit 0
fi
if [[ $2 == ebpo_verl.main ]]; then
  echo "train $name steps=${steps:-none}" >> "$CALLS"
  [[ $name == "${FAIL_EXPERIMENT:-}" ]] && exit 1
  mkdir -p "$(dirname "$mlog")" "$ckpt/global_step_3/actor"
  echo 3 > "$ckpt/latest_checkpointed_iteration.txt"
  echo '{"step": 3, "data": {"actor/grad_norm": 0.1}}' >> "$mlog"
  exit 0
fi
shift 2
cmd=$1
shift
while (($#)); do
  case $1 in
    --model) model=$2 ;;
    --protocol) protocol=$2 ;;
    --out) out=$2 ;;
  esac
  shift
done
if [[ $cmd == generate ]]; then
  echo "generate $model $protocol" >> "$CALLS"
  [[ $model == *"/${FAIL_EVAL:-none}" ]] && exit 1
  mkdir -p "$(dirname "$out")" && touch "$out"
  exit 0
fi
acc=50.0
[[ $out == *-ebpo-* ]] && acc=60.0
line=""
for b in math500 aime2024 aime2025 amc23 olympiadbench; do
  line+="\"$b\": {\"pass@1\": $acc, \"runs\": 16, \"problems\": 10, \"complete\": true}, "
done
echo "{\"protocol\": \"$protocol\", \"model\": \"x\", \"benchmarks\": {${line%, }}}" > "$out"
"""


def fake_driver(tmp_path: Path, prepare: bool = True):
    """A caller of table_curriculum.sh with FAKE_PYTHON standing in for training and evaluation."""
    fake = tmp_path / "fake_python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)

    def drive(work: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
        if prepare:
            data = work / "data"
            data.mkdir(parents=True, exist_ok=True)
            for name in ["dapo_math", *VAL_SETS, "dapo_math.pass_rate.Qwen3-8B-Base"]:
                (data / f"{name}.parquet").touch()
        env = {"PYTHON": str(fake), "REAL_PYTHON": sys.executable, "CALLS": str(work / "calls"), **env}
        return run_recipe("table_curriculum.sh", work, *args, **env)

    return drive


def test_table_driver_dry_run_trains_marks_evaluates_and_tabulates_nothing(tmp_path):
    """DRY_RUN=1 / PRINT_OVERRIDES=1 on a driver: each run's pre-flight only, the evaluation and table commands
    printed, no .done marker, no evaluation, no table, exit 0 -- on a fresh WORK_DIR and with existing log
    folders; VAL_SETS with ", " stays one value (it once became a command)."""
    drive = fake_driver(tmp_path, prepare=False)
    names = [f"qwen3_8b_base-{a}-g4-difficulty-rw_paper-bl_paper" for a in ("ebpo", "grpo", "drgrpo", "dapo")]
    work, calls = tmp_path / "fresh", tmp_path / "calls"  # WORK_DIR does not exist
    for attempt in ("fresh", "log dirs exist"):
        result = drive(work, DRY_RUN="1", CALLS=str(calls))
        assert result.returncode == 0, (attempt, result.stderr)
        assert calls.read_text().splitlines() == [f"preflight {n}" for n in names]
        assert result.stderr.count("DRY_RUN: would evaluate: ") == 4
        assert result.stderr.count("DRY_RUN: would tabulate: ") == 1
        assert f"EVAL_DIR={work}/eval/{names[0]} bash {RECIPE}/eval.sh {work}/ckpt/{names[0]}" in result.stderr
        assert not list(work.rglob(".done")) and not (work / "eval").exists() and not (work / "results").exists()
        calls.unlink()
        for n in names:
            (work / "logs" / n).mkdir(parents=True, exist_ok=True)
    result = drive(work, PRINT_OVERRIDES="1", VAL_SETS="math500, aime2024", CALLS=str(calls))
    assert result.returncode == 0, result.stderr
    assert not calls.exists() and not list(work.rglob(".done"))
    suffix = result.stdout.split("trainer.experiment_name=")[1].split("\n")[0].split("-bl_paper")[1]
    assert suffix.startswith("-v") and len(suffix) == 10  # VAL_SETS is not the driver's default
    val = f"data.val_files=['{work}/data/math500.parquet','{work}/data/aime2024.parquet']"
    assert result.stdout.splitlines().count(val) == 4


def test_table_driver_names_hash_non_default_schedules_and_overrides(tmp_path):
    """Experiment names (the .done / results keys): unchanged on the driver's schedule, a stable -v<hash> for
    any other schedule or extra Hydra overrides (TOTAL_STEPS=100 must not reuse the step-200 run)."""

    def names(*args: str, **env: str) -> list[str]:
        result = run_recipe("table_main.sh", tmp_path, "--list", *args, **env)
        assert result.returncode == 0, result.stderr
        return [line.split("\t")[2] for line in result.stdout.splitlines()[1:]]

    default = names()
    assert default[0] == "qwen3_8b-grpo-g4-random-rw_paper-bl_paper"
    assert names(TOTAL_STEPS="200", VAL_SETS="aime2024", VAL_N="8", KEEP_CKPTS="5") == default
    short, override = names(TOTAL_STEPS="100"), names("actor_rollout_ref.actor.optim.lr=2e-6")
    assert short == names(TOTAL_STEPS="100")  # stable
    for other in (short, override, names(VAL_SETS="math500,aime2024")):
        assert len({*other, *default}) == 2 * len(default)
        assert all(o.startswith(d + "-v") and len(o) == len(d) + 10 for o, d in zip(other, default, strict=True))
    assert short[0] != override[0] and names(VAL_SETS="math500, aime2024") == names(VAL_SETS="math500,aime2024")


def test_table_driver_refuses_overrides_of_its_own_paths(tmp_path):
    for arg in ("trainer.default_local_dir=/x", "++trainer.experiment_name=y", "trainer.metrics_log_path=/z"):
        result = run_recipe("table_grpo_bn.sh", tmp_path, arg, DRY_RUN="1")
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert "CKPT_DIR / LOG_DIR" in result.stderr and arg in result.stderr


def test_table_driver_runs_trains_evaluates_and_tabulates(tmp_path):
    """table_curriculum.sh end to end with stand-ins for training and evaluation: one epoch (no step limit),
    eval.sh on each run's checkpoint root per the interface, .done markers and existing results (a second call
    runs nothing), a failed run leaves empty cells and a non-zero exit, a failed evaluation is retried."""
    ebpo, grpo = (f"qwen3_8b_base-{a}-g4-difficulty-rw_paper-bl_paper" for a in ("ebpo", "grpo"))
    names = [f"qwen3_8b_base-{a}-g4-difficulty-rw_paper-bl_paper" for a in ("ebpo", "grpo", "drgrpo", "dapo")]
    drive = fake_driver(tmp_path)

    work = tmp_path / "ok"
    result = drive(work)
    assert result.returncode == 0, result.stderr
    assert (work / "calls").read_text().splitlines() == [
        line for n in names for line in (f"train {n} steps=none", f"generate {work}/ckpt/{n} paper")
    ]
    assert (work / "eval" / ebpo / "results-paper.json").is_file()
    table = (work / "results" / "rw_paper-bl_paper" / "paper" / "curriculum.md").read_text()
    assert "| EBPO-diff |" in table and "60.00 | 60.00 | 60.00 | 60.00 | 60.00 | 60.00 |" in table
    assert "| +10.00 | +10.00 | +10.00 | +10.00 | +10.00 |" in table
    (work / "calls").unlink()
    assert drive(work).returncode == 0 and not (work / "calls").exists()  # all done: nothing re-runs

    work = tmp_path / "failing"
    result = drive(work, FAIL_EXPERIMENT=grpo)
    assert result.returncode == 2 and f"{grpo} (training)" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("ebpo recipe: failed")
    table = (work / "results" / "rw_paper-bl_paper" / "paper" / "curriculum.md").read_text()
    assert "| GRPO-diff |  |  |  |  |  |  |" in table
    assert (work / "logs" / ebpo / ".done").exists() and not (work / "logs" / grpo / ".done").exists()

    work = tmp_path / "failing-eval"  # a failed evaluation is retried on the next call, the training is not
    result = drive(work, FAIL_EVAL=grpo)
    assert result.returncode == 2 and f"{grpo} (evaluation)" in result.stderr
    (work / "calls").unlink()
    assert drive(work).returncode == 0
    assert (work / "calls").read_text().splitlines() == [f"generate {work}/ckpt/{grpo} paper"]
    assert (
        "50.00 | 50.00 | 50.00 | 50.00 | 50.00 | 50.00 |"
        in (work / "results" / "rw_paper-bl_paper" / "paper" / "curriculum.md").read_text()
    )


def test_table_drivers_list_distinct_experiments_on_the_authors_schedule(compose, tmp_path):
    """--list of every driver: distinct names and rows, each listed command composes into that experiment with
    REWARD/BASELINES paper, AIME24 x 8 validation every 5 steps (and before training), a checkpoint every 10, 2
    kept, step 200 (main tables) or one epoch (curriculum); baselines on a shuffled stream, EBPO in topic order."""
    counts = {"main": 15, "group_size": 9, "ordering": 4, "curriculum": 4, "grpo_bn": 6}
    composed = 0
    for table, count in counts.items():
        out = run_recipe(f"table_{table}.sh", tmp_path, "--list").stdout.splitlines()
        rows = [line.split("\t") for line in out[1:]]
        assert out[0].split("\t") == ["section", "method", "experiment", "results", "command"]
        assert len(rows) == count, table
        assert len({r[2] for r in rows}) == count and len({r[3] for r in rows}) == count
        assert len({(r[0], r[1]) for r in rows}) == count
        for _section, method, experiment, results, command in rows:
            assert experiment.endswith("-rw_paper-bl_paper")
            assert results == f"{tmp_path}/eval/{experiment}/results-paper.json"
            words = command.split()
            env = dict(w.split("=", 1) for w in words[:-2])
            printed = overrides(Path(words[-1]).name, tmp_path, **env)
            assert f"trainer.experiment_name={experiment}" in printed
            if composed < 6 or table == "curriculum":  # a few through Hydra; the rest by their printed overrides
                cfg = compose(printed)
                composed += 1
                assert cfg.trainer.test_freq == 5 and cfg.trainer.save_freq == 10 and cfg.trainer.val_before_train
                assert cfg.actor_rollout_ref.rollout.val_kwargs.n == 8
                assert list(cfg.data.val_files) == [f"{tmp_path}/data/aime2024.parquet"]
                assert cfg.trainer.max_actor_ckpt_to_keep == 2
                assert cfg.reward.custom_reward_function.path == "pkg://ebpo_verl.paper_reward"
                if table == "curriculum":
                    assert cfg.trainer.total_training_steps is None and cfg.trainer.total_epochs == 1
                else:
                    assert cfg.trainer.total_training_steps == 200 and cfg.trainer.total_epochs >= 200
            order = "random" if method in ("GRPO", "Dr.GRPO", "DAPO", "EntropyMech") else None
            if order and table != "curriculum":
                assert f"++data.curriculum.order={order}" in printed, experiment
            if method.startswith("EBPO") and "naive" not in experiment and table != "curriculum":
                assert "++data.curriculum.order=topic" in printed, experiment
    main = run_recipe("table_main.sh", tmp_path, "--list", V2_ROWS="1").stdout
    assert len(main.splitlines()) == 1 + 22
    for method, algo in [("REINFORCE++", "reinforce_pp"), ("RLOO", "rloo"), ("SPO", "spo"), ("BNPO", "bnpo"),
                         ("JS", "js")]:  # fmt: skip
        assert f"Qwen3-8B\t{method}\tqwen3_8b-{algo}-g4-random-rw_paper-bl_paper" in main
    assert "Qwen3-14B\tEBPO-BB\tqwen3_14b-ebpo_bb-g4-topic-rw_paper-bl_paper" in main
    canonical = run_recipe(
        "table_main.sh", tmp_path, "--list", REWARD="math_verify", BASELINES="canonical", TOTAL_STEPS="50"
    ).stdout
    assert "Qwen3-8B\tDAPO\tqwen3_8b-dapo-g4-topic-rw_math_verify-bl_canonical" in canonical
    assert "TOTAL_STEPS=50 " in canonical and "TOTAL_STEPS=200" not in canonical
    both = run_recipe("table_grpo_bn.sh", tmp_path, "--list", EVAL_PROTOCOL="both").stdout.splitlines()[1]
    name = both.split("\t")[2]
    assert both.split("\t")[3] == f"{tmp_path}/eval/{name}/results-paper.json,{tmp_path}/eval/{name}/results-verl.json"


# what the GPU recipes run: data preparation (incl. topic labels and pass rates), training, evaluation, tables
RECIPE_PATH_SOURCES = ["ebpo_verl", "data_prep", "scripts/make_tables.py", "scripts/paper_numbers.py"]
FIRST_PARTY = {"ebpo_verl", "data_prep", "paper_numbers"}


def recipe_imports() -> set[str]:
    """Top-level modules imported anywhere (also lazily, in functions) by the recipe path's sources; the CPU
    study (ebpo_verl/study, its own `study` extra) is not on it."""
    import ast

    files = []
    for source in RECIPE_PATH_SOURCES:
        path = ROOT / source
        files += [path] if path.is_file() else [p for p in path.rglob("*.py") if "study" not in p.parts]
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
    uncovered = {
        module: providers.get(module, [module])
        for module in imports
        if not {canonicalize_name(d) for d in providers.get(module, [module])} & closure
    }
    assert uncovered == {}
    # and the base install alone would not do: the labels extra is what the default path was missing
    base = requirement_closure(requires, set())
    assert not {"sentence-transformers", "umap-learn", "scikit-learn"} <= base
    assert "vllm" in closure and "vllm" not in base
