"""recipe/ebpo: the shell recipes compose into the configs the paper and the baselines call for (CPU only).

Composition through the entry point costs seconds per process, so the ALGO x ORDER matrix is checked by letting
the shell print its Hydra overrides (PRINT_OVERRIDES=1) and composing them in-process with Hydra's compose API
on the package config; a few real ``DRY_RUN=1`` subprocesses check the same path end to end, and one of them is
compared with the in-process composition of the same overrides. Expected values are written from the paper
(arXiv 2602.05165, "Setup") and the baselines' definitions, not read from the scripts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipe" / "ebpo"
SCRIPTS = sorted(RECIPE.glob("*.sh"))
MODELS = {"qwen3_8b": "Qwen/Qwen3-8B", "qwen3_14b": "Qwen/Qwen3-14B", "llama3_8b": "meta-llama/Llama-3.1-8B-Instruct"}
ALGOS = ["ebpo", "ebpo_bb", "ebpo_batch", "grpo", "grpo_bn", "drgrpo", "dapo", "entropy_mech", "rloo", "reinforce_pp"]
ORDERS = ["topic", "naive", "difficulty", "random"]
VAL_SETS = ["math500", "aime2024", "aime2025", "amc23", "olympiadbench"]

# ALGO -> {dotted key: expected value}; keys not listed must keep the shared setting (SHARED below)
ALGO_EXPECT = {
    "ebpo": {"algorithm.adv_estimator": "ebpo"},
    "ebpo_bb": {"algorithm.adv_estimator": "ebpo", "algorithm.ebpo.prior": "beta_binomial"},
    "ebpo_batch": {"algorithm.adv_estimator": "ebpo", "algorithm.ebpo.stats_scope": "batch"},
    "grpo": {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": True},
    "grpo_bn": {"algorithm.adv_estimator": "ebpo", "algorithm.ebpo.shrinkage": 0, "algorithm.ebpo.norm": "batch"},
    "drgrpo": {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": False,
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm",
        "actor_rollout_ref.actor.loss_scale_factor": 8192,
        "actor_rollout_ref.actor.use_kl_loss": False,
    },
    "dapo": {
        "algorithm.adv_estimator": "grpo",
        "actor_rollout_ref.actor.clip_ratio_high": 0.28,
        "actor_rollout_ref.actor.use_kl_loss": False,
        "algorithm.filter_groups.enable": True,
        "algorithm.filter_groups.metric": "acc",
        "reward.reward_manager.name": "dapo",
        "reward.reward_kwargs.max_resp_len": 8192,
        "reward.reward_kwargs.overlong_buffer_cfg.enable": True,
        "reward.reward_kwargs.overlong_buffer_cfg.len": 2048,
        "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": 1.0,
    },
    "entropy_mech": {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.actor.policy_loss.loss_mode": "clip_cov"},
    "rloo": {"algorithm.adv_estimator": "rloo"},
    "reinforce_pp": {"algorithm.adv_estimator": "reinforce_plus_plus_baseline"},
}
# the paper's shared setup, and what every run keeps unless its ALGO changes it
SHARED = {
    "data.train_batch_size": 512,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 128,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.optim.weight_decay": 0.01,
    "actor_rollout_ref.actor.use_kl_loss": True,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.clip_ratio_low": 0.2,
    "actor_rollout_ref.actor.clip_ratio_high": 0.2,
    "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
    "data.max_prompt_length": 4096,
    "data.max_response_length": 8192,
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
    "reward.custom_reward_function.path": "pkg://ebpo_verl.reward",
    "reward.custom_reward_function.name": "compute_score",
    "data.custom_cls.path": "pkg://ebpo_verl.curriculum",
    "data.custom_cls.name": "CurriculumDataset",
    "data.shuffle": False,
    "data.dataloader_num_workers": 0,
    "trainer.logger": ["console"],
    "trainer.nnodes": 4,
    "trainer.n_gpus_per_node": 8,
    "trainer.use_v1": True,
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


def overrides(script: str, work: Path, *args: str, **env: str) -> list[str]:
    out = subprocess.run(
        ["bash", str(RECIPE / script), *args],
        env=recipe_env(work, PRINT_OVERRIDES="1", **env),
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.splitlines()


def select(cfg, key: str):
    return OmegaConf.select(cfg, key, throw_on_missing=True)


@pytest.fixture(scope="module")
def compose():
    """Compose the package config (ebpo_verl/config/ebpo_trainer.yaml) in-process with a list of overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import ebpo_verl

    config_dir = Path(ebpo_verl.__file__).resolve().parent / "config"
    GlobalHydra.instance().clear()  # in case another test left Hydra initialised
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        yield lambda ovr: hydra_compose("ebpo_trainer", overrides=ovr)


def test_scripts_parse_and_pass_shellcheck():
    names = {p.name for p in SCRIPTS}
    expected = {"common.sh", "eval.sh", "run_qwen3_8b.sh", "run_qwen3_14b.sh", "run_llama3_8b.sh"}
    expected |= {f"table_{t}.sh" for t in ("main", "group_size", "ordering", "curriculum", "grpo_bn")}
    assert expected <= names
    for script in SCRIPTS:
        subprocess.run(["bash", "-n", str(script)], check=True)
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
    result = subprocess.run([shellcheck, "-x", *map(str, SCRIPTS)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algo_and_order_composes_with_intended_values(compose, tmp_path, algo):
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn

    from ebpo_verl.validation import check_config

    for order in ORDERS:
        cfg = compose(overrides("run_qwen3_8b.sh", tmp_path, ALGO=algo, ORDER=order))
        expect = {**SHARED, **ALGO_EXPECT[algo], **ORDER_EXPECT[order]}
        expect["actor_rollout_ref.rollout.n"] = 4
        expect["actor_rollout_ref.model.path"] = "Qwen/Qwen3-8B"
        expect["trainer.total_epochs"] = 1 if order == "difficulty" else 3
        expect["trainer.experiment_name"] = f"qwen3_8b-{algo}-g4-{order}"
        expect["trainer.default_local_dir"] = f"{tmp_path}/ckpt/qwen3_8b-{algo}-g4-{order}"
        expect["trainer.metrics_log_path"] = f"{tmp_path}/logs/qwen3_8b-{algo}-g4-{order}/metrics.jsonl"
        expect["data.train_files"] = [f"{tmp_path}/data/{TRAIN_FILE[order]}"]
        expect["data.val_files"] = [f"{tmp_path}/data/{name}.parquet" for name in VAL_SETS]
        got = {key: select(cfg, key) for key in expect}
        got = {k: OmegaConf.to_object(v) if OmegaConf.is_config(v) else v for k, v in got.items()}
        assert got == expect, f"ALGO={algo} ORDER={order}"
        # the names are verl's (or the plugin's) real ones, and the package's pre-flight checks accept the run
        get_adv_estimator_fn(cfg.algorithm.adv_estimator)
        get_policy_loss_fn(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
        check_config(cfg)


def test_presets_pass_verl_validation_and_use_registered_managers(compose, tmp_path):
    """verl's own validate_config (batch sizes vs GPUs, loss modes, ...) on every ALGO, Qwen3-14B layout."""
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    for algo in ALGOS:
        cfg = compose(overrides("run_qwen3_14b.sh", tmp_path, ALGO=algo))
        assert cfg.reward.reward_manager.name in REWARD_MANAGER
        assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
        assert need_reference_policy(cfg) == bool(cfg.actor_rollout_ref.actor.use_kl_loss)
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


def test_group_size_env_and_extra_arguments_pass_through(compose, tmp_path):
    ovr = overrides(
        "run_llama3_8b.sh", tmp_path, "algorithm.adv_estimator=grpo", "trainer.save_freq=3", GROUP_SIZE="16"
    )
    cfg = compose(ovr)
    assert cfg.actor_rollout_ref.rollout.n == 16
    assert cfg.algorithm.adv_estimator == "grpo"  # extra arguments come last and win
    assert cfg.trainer.save_freq == 3
    assert cfg.trainer.experiment_name == "llama3_8b-ebpo-g16-topic"
    assert cfg.actor_rollout_ref.model.path == MODELS["llama3_8b"]
    cfg = compose(overrides("run_qwen3_8b.sh", tmp_path, EXPERIMENT="mine", TOTAL_STEPS="7", ORDER="naive"))
    assert cfg.trainer.experiment_name == "mine" and cfg.trainer.total_training_steps == 7
    assert cfg.trainer.metrics_log_path == f"{tmp_path}/logs/mine/metrics.jsonl"


def test_bad_switches_fail_with_a_message(tmp_path):
    for env, words in [({"ALGO": "ppo"}, "unknown ALGO=ppo"), ({"ORDER": "size"}, "unknown ORDER=size")]:
        result = subprocess.run(
            ["bash", str(RECIPE / "run_qwen3_8b.sh")],
            env=recipe_env(tmp_path, PRINT_OVERRIDES="1", **env),
            capture_output=True,
            text=True,
        )
        assert result.returncode == 2 and words in result.stderr
    cases = [
        ({"TOPICS": "file"}, "TOPICS=file needs TRAIN_FILE"),
        ({"DATA_DIR": "/data/it's"}, "single quote"),
    ]
    for env, words in cases:
        result = subprocess.run(
            ["bash", str(RECIPE / "run_qwen3_8b.sh")],
            env=recipe_env(tmp_path, PRINT_OVERRIDES="1", **env),
            capture_output=True,
            text=True,
        )
        assert result.returncode == 2 and words in result.stderr, result.stderr
    own = overrides("run_qwen3_8b.sh", tmp_path, TOPICS="file", TRAIN_FILE="/d/gpt_topics.parquet")
    assert "data.train_files=['/d/gpt_topics.parquet']" in own and "++data.curriculum.order=topic" in own


def test_dry_run_subprocesses_compose_without_preparing_data(compose, tmp_path):
    """Every run script through the real entry point (`--cfg job`), in parallel."""
    runs = {
        "run_qwen3_8b.sh": [],
        "run_qwen3_14b.sh": [],
        "run_llama3_8b.sh": ["trainer.test_freq=2"],
    }
    procs = {
        name: subprocess.Popen(
            ["bash", str(RECIPE / name), *args],
            env=recipe_env(tmp_path, DRY_RUN="1", ALGO="dapo"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in runs.items()
    }
    outputs = {name: proc.communicate(timeout=600) for name, proc in procs.items()}
    for name, (_out, err) in outputs.items():
        assert procs[name].returncode == 0, f"{name}: {err[-3000:]}"
        assert "would prepare data" in err and "data_prep.all" in err, name
    assert not (tmp_path / "data").exists()  # DRY_RUN prepares nothing
    configs = {name: yaml.safe_load(out) for name, (out, _) in outputs.items()}
    assert configs["run_qwen3_8b.sh"]["actor_rollout_ref"]["model"]["path"] == MODELS["qwen3_8b"]
    assert configs["run_qwen3_14b.sh"]["actor_rollout_ref"]["model"]["path"] == MODELS["qwen3_14b"]
    assert configs["run_llama3_8b.sh"]["trainer"]["test_freq"] == 2
    # the in-process composition of the printed overrides is the same config as the real dry run
    same = compose(overrides("run_qwen3_8b.sh", tmp_path, ALGO="dapo"))
    assert OmegaConf.to_container(same) == configs["run_qwen3_8b.sh"]


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
    assert (tmp_path / "logs" / "qwen3_8b-ebpo-g4-topic").is_dir()
    log.unlink()  # everything is there now: straight to training
    subprocess.run(["bash", str(RECIPE / "run_qwen3_8b.sh")], env=env, check=True, capture_output=True)
    assert log.read_text().splitlines() == ["-m ebpo_verl.main"]


FAKE_TRAINER = r"""#!/usr/bin/env bash
# Stands in for `python -m ebpo_verl.main`: records the call, writes a checkpoint and a metrics log.
if [[ $1 != -m || $2 != ebpo_verl.main ]]; then exec "$REAL_PYTHON" "$@"; fi
for a in "$@"; do
  case $a in
    trainer.experiment_name=*) name=${a#*=} ;;
    trainer.metrics_log_path=*) mlog=${a#*=} ;;
    trainer.default_local_dir=*) ckpt=${a#*=} ;;
    trainer.val_only=True) eval=1 ;;
    trainer.resume_from_path=*) from=${a#*=} ;;
    actor_rollout_ref.model.path=*) model=${a#*=} ;;
  esac
done
echo "$name ${eval:-0} $model" >> "$CALLS"
[[ $name == "${FAIL_EXPERIMENT:-}" ]] && exit 1
mkdir -p "$(dirname "$mlog")"
if [[ -n ${eval:-} ]]; then
  acc=0.5; [[ $name == *ebpo* ]] && acc=0.6
  step=${from##*global_step_}
  line=""
  for b in math500 aime2024 aime2025 amc23 olympiadbench; do line+="\"val-core/$b/acc/mean@16\": $acc, "; done
  echo "{\"step\": $step, \"data\": {${line%, }}}" >> "$mlog"
else
  mkdir -p "$ckpt/global_step_3/actor"
  echo 3 > "$ckpt/latest_checkpointed_iteration.txt"
  echo '{"step": 3, "data": {"actor/grad_norm": 0.1}}' >> "$mlog"
fi
"""


def test_table_driver_runs_trains_evaluates_and_tabulates(tmp_path):
    """table_curriculum.sh end to end with a stand-in trainer: runs in order, final-checkpoint evaluation,
    .done markers (a second call runs nothing), a failed run leaves empty cells and a non-zero exit."""
    fake = tmp_path / "fake_python"
    fake.write_text(FAKE_TRAINER)
    fake.chmod(0o755)

    def drive(work: Path, **env: str) -> subprocess.CompletedProcess:
        data = work / "data"
        data.mkdir(parents=True, exist_ok=True)
        for name in ["dapo_math", *VAL_SETS, "dapo_math.pass_rate.Qwen3-8B-Base"]:
            (data / f"{name}.parquet").touch()
        return subprocess.run(
            ["bash", str(RECIPE / "table_curriculum.sh")],
            env=recipe_env(work, PYTHON=str(fake), REAL_PYTHON=sys.executable, CALLS=str(work / "calls"), **env),
            capture_output=True,
            text=True,
        )

    work = tmp_path / "ok"
    result = drive(work)
    assert result.returncode == 0, result.stderr
    assert (work / "calls").read_text().splitlines() == [
        "qwen3_8b_base-ebpo-g4-difficulty 0 Qwen/Qwen3-8B-Base",
        "eval-qwen3_8b_base-ebpo-g4-difficulty 1 Qwen/Qwen3-8B-Base",
        "qwen3_8b_base-grpo-g4-difficulty 0 Qwen/Qwen3-8B-Base",
        "eval-qwen3_8b_base-grpo-g4-difficulty 1 Qwen/Qwen3-8B-Base",
    ]
    table = (work / "results" / "curriculum.md").read_text()
    assert "| Qwen3-8B-Base | EBPO-diff | 60.00 | 60.00 | 60.00 | 60.00 | 60.00 | 60.00 |  |  | 3 |" in table
    assert "| Qwen3-8B-Base | EBPO-diff − GRPO-diff | +10.00 | +10.00 | +10.00 | +10.00 | +10.00 |" in table
    (work / "calls").unlink()
    assert drive(work).returncode == 0 and not (work / "calls").exists()  # all done: nothing re-runs

    work = tmp_path / "failing"
    result = drive(work, FAIL_EXPERIMENT="qwen3_8b_base-grpo-g4-difficulty")
    assert result.returncode == 2 and "qwen3_8b_base-grpo-g4-difficulty (training)" in result.stderr
    assert (
        "| Qwen3-8B-Base | GRPO-diff |  |  |  |  |  |  |  |  |  |" in (work / "results" / "curriculum.md").read_text()
    )
    assert (work / "logs" / "qwen3_8b_base-ebpo-g4-difficulty" / ".done").exists()
    assert (work / "logs" / "eval-qwen3_8b_base-ebpo-g4-difficulty" / ".done").exists()
    assert not (work / "logs" / "qwen3_8b_base-grpo-g4-difficulty" / ".done").exists()

    work = tmp_path / "failing-eval"  # a failed evaluation is retried on the next call, the training is not
    result = drive(work, FAIL_EXPERIMENT="eval-qwen3_8b_base-grpo-g4-difficulty")
    assert result.returncode == 2 and "qwen3_8b_base-grpo-g4-difficulty (evaluation)" in result.stderr
    (work / "calls").unlink()
    assert drive(work).returncode == 0
    assert (work / "calls").read_text().splitlines() == ["eval-qwen3_8b_base-grpo-g4-difficulty 1 Qwen/Qwen3-8B-Base"]
    assert "| GRPO-diff | 50.00 |" in (work / "results" / "curriculum.md").read_text()


def test_table_driver_lists_distinct_experiments_that_match_the_recipes(tmp_path):
    counts = {"main": 15, "group_size": 9, "ordering": 4, "curriculum": 2, "grpo_bn": 6}
    for table, count in counts.items():
        out = subprocess.run(
            ["bash", str(RECIPE / f"table_{table}.sh"), "--list"],
            env=recipe_env(tmp_path),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        rows = [line.split("\t") for line in out[1:]]
        assert out[0].split("\t") == ["section", "method", "experiment", "metrics", "command"]
        assert len(rows) == count, table
        assert len({r[2] for r in rows}) == count and len({r[3] for r in rows}) == count
        assert len({(r[0], r[1]) for r in rows}) == count
        for _section, _method, experiment, metrics, command in rows:
            assert metrics == f"{tmp_path}/logs/eval-{experiment}/metrics.jsonl"
            # the listed command really trains that experiment under that name
            words = command.split()
            env = dict(w.split("=", 1) for w in words[:-2])
            printed = overrides(Path(words[-1]).name, tmp_path, **env)
            assert f"trainer.experiment_name={experiment}" in printed
            assert f"actor_rollout_ref.rollout.n={env['GROUP_SIZE']}" in printed
    main = subprocess.run(
        ["bash", str(RECIPE / "table_main.sh"), "--list"],
        env=recipe_env(tmp_path, V2_ROWS="1"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert len(main.splitlines()) == 1 + 19 and "Qwen3-8B\tREINFORCE++\tqwen3_8b-reinforce_pp-g4-topic" in main
