"""Entry point: config composition on top of the installed verl config, and the driver-side pre-flight checks."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from ebpo_verl.algos.baselines import SPOOptions, SPOState
from ebpo_verl.algos.dbb import DBBOptions
from ebpo_verl.algos.ebpo import EBPOOptions
from ebpo_verl.algos.ebpo_state import EBPOState
from ebpo_verl.algos.registry import get
from ebpo_verl.ops.errors import EBPOConfigError
from ebpo_verl.trainer.checkpoint.state import save_state
from ebpo_verl.trainer.config.generate import ESTIMATOR_SECTIONS
from ebpo_verl.trainer.preflight import check_config
from tests.in_process import ebpo_train

EBPO, SPO = get("ebpo"), get("spo")

REPO = Path(__file__).resolve().parents[1]
HUB_MODEL = "actor_rollout_ref.model.path=Qwen/Qwen3-8B"
"""A model the pre-flight accepts without looking it up (a hub id; verl's default ~/models/... is not there)."""


def _leaves(node, prefix: str = "") -> dict[str, object]:
    if isinstance(node, dict):
        out: dict[str, object] = {}
        for key, value in node.items():
            out.update(_leaves(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def test_main_config_is_verl_ppo_trainer_plus_only_the_ebpo_deltas(compose_config):
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        verl_cfg = _leaves(OmegaConf.to_container(compose("ppo_trainer"), resolve=False))
    ours_cfg = compose_config()
    ours = _leaves(OmegaConf.to_container(ours_cfg, resolve=False))

    assert set(verl_cfg) - set(ours) == set()
    changed = {key for key in ours if key not in verl_cfg or ours[key] != verl_cfg[key]}
    others = tuple(f"{cls.SECTION}." for cls in ESTIMATOR_SECTIONS if cls is not EBPOOptions)  # their own blocks
    changed = {key for key in changed if not key.startswith(others)}
    assert ours_cfg.algorithm.dbb == OmegaConf.create(dataclasses.asdict(DBBOptions()))
    defaults = dataclasses.asdict(EBPOOptions())
    assert changed == {
        "algorithm.adv_estimator",
        *(f"algorithm.ebpo.{key}" for key in defaults),
        "reward.custom_reward_function.path",
        "trainer.metrics_log_path",
        "trainer.step_timeout_s",
        "trainer.init_timeout_s",
        "trainer.trust_checkpoint",
        "actor_rollout_ref.rollout.n",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    }
    assert ours_cfg.actor_rollout_ref.rollout.n == 4  # the paper's G; verl's default n=1 is refused by shrinkage=auto
    assert ours_cfg.algorithm.adv_estimator == "ebpo"
    assert OmegaConf.to_container(ours_cfg.algorithm.ebpo) == defaults
    assert ours_cfg.reward.custom_reward_function.path == "pkg://ebpo_verl.reward"
    assert ours_cfg.reward.custom_reward_function.name == "compute_score"
    assert ours_cfg.trainer.metrics_log_path == f"{ours_cfg.trainer.default_local_dir}/metrics.jsonl"


def test_main_overrides_reach_the_options(compose_config):
    config = compose_config(
        "algorithm.ebpo.shrinkage=0.25",
        "algorithm.ebpo.cluster_key=topic",
        "algorithm.ebpo.prior=beta_binomial",
        "actor_rollout_ref.rollout.n=1",
    )
    options = check_config(config).estimator
    assert options == EBPOOptions(shrinkage=0.25, cluster_key="topic", prior="beta_binomial")
    grpo = compose_config("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1")
    assert check_config(grpo).estimator is None


CURRICULUM = ["data.custom_cls.path=pkg://ebpo_verl.trainer.curriculum", "data.custom_cls.name=CurriculumDataset"]
ERRORS = {
    "group-size": (
        ["actor_rollout_ref.rollout.n=1"],
        "rollout.n=1 but algorithm.adv_estimator=ebpo needs at least 2 responses per prompt (shrinkage=auto",
    ),
    "unknown-key": (
        ["actor_rollout_ref.rollout.n=4", "+algorithm.ebpo.shrinkage_floor=0.1"],
        "unknown option algorithm.ebpo.shrinkage_floor; did you mean algorithm.ebpo.shrinkage? valid keys: prior, ",
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
def test_main_check_config_errors(case, compose_config):
    overrides, message = ERRORS[case]
    with pytest.raises(EBPOConfigError) as err:
        check_config(compose_config(*overrides))
    assert message in str(err.value)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "ebpo_verl.main", *args], capture_output=True, text=True, timeout=300, cwd=REPO, env=env
    )


@pytest.mark.slow
def test_main_cli_prints_config_and_rejects_bad_config_without_ray(tmp_path):
    shown = _cli("--cfg", "job", "algorithm.ebpo.cluster_key=topic", "actor_rollout_ref.rollout.n=8", HUB_MODEL)
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

    from ebpo_verl.trainer import adapter
    from ebpo_verl.trainer.preflight.registry import check_registered

    check_registered("ebpo")
    monkeypatch.setattr(adapter, "register", lambda: None)  # as if verl's plugin loader had failed silently
    monkeypatch.setattr(core_algos, "ADV_ESTIMATOR_REGISTRY", {})
    with pytest.raises(EBPOConfigError, match=r"'ebpo' is not registered in the TaskRunner process \(pid \d+"):
        check_registered("ebpo")


# --- the pre-flight: the same checks for `--cfg job` as for a real run --------------------------------------------


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("ebpo-train: error:")]


def _parquet(path: Path, rows: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    prompt = [[{"role": "user", "content": f"{i} + 1?"}] for i in range(rows)]
    pq.write_table(pa.table({"prompt": prompt, "reward_model": [{"ground_truth": "1"}] * rows}), path)
    return path


def test_main_bare_dry_run_passes_preflight(monkeypatch, capsys):
    code, out, err = ebpo_train(monkeypatch, capsys, "--cfg", "job")
    assert code == 0, err
    config = yaml.safe_load(out)  # stdout is the config alone
    assert config["actor_rollout_ref"]["rollout"]["n"] == 4
    assert (
        "pre-flight: ok (world size 8; steps per epoch not checked: data.train_files "
        "/nonexistent-home/data/rlhf/gsm8k/train.parquet does not exist on this machine)"
    ) in err.splitlines()
    assert "[validate_config] All configuration checks passed successfully!" in err  # verl's ran, off stdout


DRY_RUN_ERRORS = {
    "prior": (["algorithm.ebpo.prior=foo"], "algorithm.ebpo.prior='foo' is invalid; use gaussian or beta_binomial"),
    "shrinkage": (["algorithm.ebpo.shrinkage=1.5"], "algorithm.ebpo.shrinkage=1.5 is invalid; use auto or a float"),
    "shrinkage-as-recipes-write-it": (
        ["++algorithm.ebpo.shrinkage=2"],
        "algorithm.ebpo.shrinkage=2 is invalid; use auto or a float in [0, 1]",
    ),
    "step-timeout": (
        ["trainer.step_timeout_s=abc"],
        "trainer.step_timeout_s='abc' is invalid; use null or a number of seconds >= 0 (0: off)",
    ),
    "curriculum-order": (
        [*CURRICULUM, "data.shuffle=false", "++data.curriculum.order=x"],
        "data.curriculum.order='x' is invalid; use native, random, topic or difficulty",
    ),
    "curriculum-typo": (
        ["++data.curriculum.ordr=topic"],
        "unknown option data.curriculum.ordr; did you mean data.curriculum.order? valid keys: order, align, ",
    ),
    "curriculum-without-plus": (
        ["data.curriculum.order=topic"],
        "data.curriculum is not in the config: set its options with ++data.curriculum.order=... (as the recipes do)",
    ),
    "dbb-typo": (
        ["algorithm.dbb.discont=0.5"],
        "unknown option algorithm.dbb.discont; did you mean algorithm.dbb.discount? valid keys: prompt_key, ",
    ),
    "dbb-typo-with-plus-while-ebpo-runs": (
        ["+algorithm.dbb.discont=0.5"],
        "unknown option algorithm.dbb.discont; did you mean algorithm.dbb.discount? valid keys: prompt_key, ",
    ),
    "trainer-typo": (["trainer.step_timout_s=5"], "unknown option trainer.step_timout_s; did you mean trainer.step_"),
    "use_v1": (["trainer.use_v1=false"], "trainer.use_v1=false (verl's legacy RayPPOTrainer) is not supported"),
    "n=0": (["actor_rollout_ref.rollout.n=0"], "actor_rollout_ref.rollout.n=0 is invalid; use a positive integer"),
    "n=-4": (["actor_rollout_ref.rollout.n=-4"], "actor_rollout_ref.rollout.n=-4 is invalid; use a positive integer"),
    "n=abc": (
        ["actor_rollout_ref.rollout.n=abc"],
        "actor_rollout_ref.rollout.n='abc' is invalid; use a positive integer",
    ),
    "n=1": (
        ["actor_rollout_ref.rollout.n=1"],
        "actor_rollout_ref.rollout.n=1 but algorithm.adv_estimator=ebpo needs at least 2",
    ),
    "batch=0": (["data.train_batch_size=0"], "data.train_batch_size=0 is invalid; use a positive integer"),
    "typo": (
        ["algorithm.ebpo.shrinkge=0.5"],
        "unknown option algorithm.ebpo.shrinkge; did you mean algorithm.ebpo.shrinkage? valid keys: prior, ",
    ),
    "typo-with-plus": (
        ["+algorithm.ebpo.stat_scope=batch"],
        "unknown option algorithm.ebpo.stat_scope; did you mean algorithm.ebpo.stats_scope? valid keys: prior, ",
    ),
    "bnpo-kl-in-reward": (
        ["algorithm.adv_estimator=bnpo", "algorithm.use_kl_in_reward=true"],
        "algorithm.adv_estimator=bnpo needs rewards in [0, 1] or the paper's -1/+1 (it fits a Beta distribution to "
        "pass rates), but algorithm.use_kl_in_reward=True subtracts a per-token KL penalty from the reward",
    ),
    "spo-typo": (
        ["algorithm.spo.rhoo=0.5"],
        "unknown option algorithm.spo.rhoo; did you mean algorithm.spo.rho? valid keys: prompt_key, rho, n0, ",
    ),
    "spo-typo-with-plus": (
        ["algorithm.adv_estimator=spo", "+algorithm.spo.prompt_kye=index"],
        "unknown option algorithm.spo.prompt_kye; did you mean algorithm.spo.prompt_key? valid keys: prompt_key, ",
    ),
    "world-size": (
        ["trainer.nnodes=4", "data.train_batch_size=6"],
        "verl's validate_config refused the config at world size 32 (trainer.nnodes=4 x trainer.n_gpus_per_node=8): "
        "real_train_batch_size (24) must be divisible by minimal possible batch size (32)",
    ),
    "verl-micro-batch": (
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"],
        "verl's validate_config refused the config at world size 8 (trainer.nnodes=1 x trainer.n_gpus_per_node=8): "
        "[actor] Please set at least one of 'actor.ppo_micro_batch_size' or 'actor.ppo_micro_batch_size_per_gpu'",
    ),
    "verl-typo": (["trainer.totl_epochs=1"], "unknown option trainer.totl_epochs; did you mean trainer.total_epochs?"),
    "verl-no-such-key": (
        ["trainer.zzz=1"],
        "unknown option trainer.zzz: the config has no such key (to add one on purpose: +trainer.zzz=...)",
    ),
}


@pytest.mark.parametrize("case", list(DRY_RUN_ERRORS))
def test_main_dry_run_refuses_what_a_run_refuses(monkeypatch, capsys, case):
    overrides, message = DRY_RUN_ERRORS[case]
    code, out, err = ebpo_train(monkeypatch, capsys, "--cfg", "job", *overrides)
    assert code == 2
    assert out == ""
    [line] = _error_lines(err)
    assert line.startswith(f"ebpo-train: error: {message}")
    assert "Traceback" not in err and "pre-flight: ok" not in err


def test_main_keys_added_on_purpose_stay_allowed(monkeypatch, capsys):
    code, out, err = ebpo_train(monkeypatch, capsys, "--cfg", "job", "+trainer.totl_epochs=1")
    assert code == 0, err
    assert yaml.safe_load(out)["trainer"]["totl_epochs"] == 1


def test_main_refused_run_writes_nothing(monkeypatch, capsys, tmp_path):
    """A refused real run (no --cfg): one line, exit 2, Ray never started, and nothing in the working folder
    (no outputs/DATE/TIME/.hydra/ of Hydra's run directory)."""
    import ray

    monkeypatch.chdir(tmp_path)
    for override in ("actor_rollout_ref.rollout.n=1", "trainer.totl_epochs=1", "trainer.step_timeout_s=abc"):
        code, out, err = ebpo_train(monkeypatch, capsys, override)
        assert code == 2 and len(_error_lines(err)) == 1 and "Traceback" not in err
        assert list(tmp_path.iterdir()) == [] and not ray.is_initialized()


@pytest.mark.slow
def test_main_real_run_refuses_before_ray(monkeypatch, capsys, tmp_path):
    run_dir = f"hydra.run.dir={tmp_path / 'hydra'}"
    missing = tmp_path / "missing.parquet"
    cases = {
        "trainer.nnode=4": "unknown option trainer.nnode; did you mean trainer.nnodes?",
        "algorithm.ebpo.decy=0.5": "unknown option algorithm.ebpo.decy; did you mean algorithm.ebpo.decay? valid keys:",
        "actor_rollout_ref.rollout.n=abc": "actor_rollout_ref.rollout.n='abc' is invalid; use a positive integer",
        # unlike --cfg job, a real run refuses a training file that is not there
        f"data.train_files={missing}": f"data.train_files: {missing} does not exist (or is not a file); prepare the "
        "data (python -m ebpo_verl.data.all) or fix the path",
    }
    for override, message in cases.items():
        code, out, err = ebpo_train(monkeypatch, capsys, override, run_dir)
        assert code == 2, err
        [line] = _error_lines(err)
        assert line.startswith(f"ebpo-train: error: {message}")
        assert "Traceback" not in err and "pre-flight: ok" not in err


def test_main_dry_run_at_32_gpus_without_cuda(monkeypatch, capsys):
    # 32 prompts x 4 responses on 4 x 8 GPUs: 4 per rank, which the default micro-batches of 4 divide (8 prompts
    # would leave 1 per rank: refused, tests/test_preflight_batches.py); validated on this CPU-only machine
    code, out, err = ebpo_train(
        monkeypatch,
        capsys,
        "--cfg",
        "job",
        "trainer.nnodes=4",
        "data.train_batch_size=8",
        "actor.ppo_mini_batch_size=8",
    )
    assert code == 2 and _error_lines(err) == [  # a wrong key is one line too
        "ebpo-train: error: unknown option actor: the config has no such key (to add one on purpose: "
        "+actor.ppo_mini_batch_size=...)"
    ]
    code, out, err = ebpo_train(
        monkeypatch,
        capsys,
        "--cfg",
        "job",
        "trainer.nnodes=4",
        "data.train_batch_size=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    )
    assert code == 0, err
    assert "pre-flight: ok (world size 32; " in err


@pytest.mark.slow
def test_main_steps_per_epoch(monkeypatch, capsys, tmp_path):
    small, big = _parquet(tmp_path / "small.parquet", 5), _parquet(tmp_path / "big.parquet", 11)
    mini = "actor_rollout_ref.actor.ppo_mini_batch_size=8"
    code, _, err = ebpo_train(
        monkeypatch, capsys, "--cfg", "job", f"data.train_files={small}", "data.train_batch_size=8", mini
    )
    assert code == 2
    assert _error_lines(err) == [
        f"ebpo-train: error: one epoch would train 0 steps: data.train_files has 5 rows ({small}: 5 rows) but "
        "data.train_batch_size=8 (verl drops the last partial batch). Use a larger training file or "
        "data.train_batch_size<=5."
    ]
    both = f"data.train_files=[{small},{big}]"
    code, out, err = ebpo_train(monkeypatch, capsys, "--cfg", "job", both, "data.train_batch_size=8", mini)
    assert code == 0, err
    assert (
        f"pre-flight: ok (world size 8; 16 training rows ({small}: 5 rows, {big}: 11 rows; before verl's "
        "overlong-prompt filter) -> 2 steps per epoch)"
    ) in err.splitlines()
    capped = ["data.train_max_samples=7", "data.train_batch_size=8", mini]
    code, _, err = ebpo_train(monkeypatch, capsys, "--cfg", "job", both, *capped)
    assert code == 2
    assert "has 7 rows (" in err and f"{big}: 11 rows, capped by data.train_max_samples=7)" in err

    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3}\n')
    code, _, err = ebpo_train(
        monkeypatch, capsys, "--cfg", "job", f"data.train_files={jsonl}", "data.train_batch_size=8", mini
    )
    assert code == 2 and "data.train_files has 3 rows (" in err
    array = tmp_path / "rows.json"
    array.write_text('[{"a": 1},\n {"a": 2}]')
    code, _, err = ebpo_train(
        monkeypatch, capsys, "--cfg", "job", f"data.train_files={array}", "data.train_batch_size=8", mini
    )
    assert code == 2 and "data.train_files has 2 rows (" in err
    csv = tmp_path / "rows.csv"
    csv.write_text("a\n1\n")
    code, _, err = ebpo_train(monkeypatch, capsys, "--cfg", "job", f"data.train_files={csv}")
    assert (code, _error_lines(err)) == (
        2,
        [f"ebpo-train: error: data.train_files: {csv} has an unsupported format; verl reads .parquet, .json, .jsonl"],
    )

    truncated = tmp_path / "cut.parquet"
    truncated.write_bytes(big.read_bytes()[:-20])
    code, _, err = ebpo_train(monkeypatch, capsys, "--cfg", "job", f"data.train_files={truncated}")
    assert code == 2
    [line] = _error_lines(err)
    assert line.startswith(f"ebpo-train: error: data.train_files: {truncated} is not a readable verl data file (")


def test_main_dry_run_package_and_resolve(monkeypatch, capsys):
    code, out, err = ebpo_train(monkeypatch, capsys, "--cfg", "job", "--package", "algorithm.ebpo", "--resolve")
    assert code == 0, err
    assert out.splitlines()[0] == "# @package algorithm.ebpo"
    assert yaml.safe_load(out) == dataclasses.asdict(EBPOOptions())


def _entry_point(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``ebpo-train ARGS`` through the INSTALLED console-script entry point (as pip's wrapper script runs it)."""
    code = (
        "import sys; from importlib.metadata import entry_points; "
        "[ep] = entry_points(group='console_scripts', name='ebpo-train'); "
        f"sys.argv = ['ebpo-train', *{list(args)!r}]; sys.exit(ep.load()())"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_main_console_script(tmp_path):
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONWARNINGS": "ignore", "HOME": str(tmp_path)}
    script = Path(sys.executable).parent / "ebpo-train"
    assert script.is_file(), "pip install -e . installs the ebpo-train script"
    shown = subprocess.run(
        [str(script), "--cfg", "job", "algorithm.ebpo.cluster_key=topic", HUB_MODEL],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # not the repository: the config must come from the installed package
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    assert yaml.safe_load(shown.stdout)["algorithm"]["ebpo"]["cluster_key"] == "topic"
    assert "pre-flight: ok (world size 8; " in shown.stderr

    typo = _entry_point("algorithm.ebpo.shrinkge=0.5", f"hydra.run.dir={tmp_path}", env=env)
    assert typo.returncode == 2
    assert (
        typo.stderr.strip()
        .splitlines()[-1]
        .startswith("ebpo-train: error: unknown option algorithm.ebpo.shrinkge; did you mean algorithm.ebpo.shrinkage?")
    )
    # a real run (no --cfg) goes through hydra.main and refuses before Ray: its config module must resolve too
    bad = _entry_point("actor_rollout_ref.rollout.n=abc", f"hydra.run.dir={tmp_path}", env=env)
    assert bad.returncode == 2, bad.stderr
    assert _error_lines(bad.stderr) == [
        "ebpo-train: error: actor_rollout_ref.rollout.n='abc' is invalid; use a positive integer"
    ]
    assert "Traceback" not in bad.stderr


def _checkpoint(root: Path, step: int, ebpo: EBPOOptions | None = None, spo: SPOOptions | None = None) -> Path:
    """A checkpoint folder as verl + our trainer leave it: global_step_N with the state files, then the tracker."""
    folder = root / f"global_step_{step}"
    folder.mkdir(parents=True)
    if ebpo is not None:
        save_state(EBPO, folder, EBPOState(), ebpo, step)
    if spo is not None:
        save_state(SPO, folder, SPOState(), spo, step)
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return folder


@pytest.mark.slow
def test_main_preflight_refuses_a_resume_with_other_options_before_ray(monkeypatch, capsys, tmp_path):
    ckpt = tmp_path / "ckpt"
    folder = _checkpoint(ckpt, 3, ebpo=EBPOOptions(decay=0.9))
    where = f"trainer.default_local_dir={ckpt}"
    code, out, err = ebpo_train(monkeypatch, capsys, "--cfg", "job", where, "algorithm.ebpo.decay=0.9")
    assert code == 0 and f"resumes from {folder}" in err
    for args in (("--cfg", "job"), (f"hydra.run.dir={tmp_path / 'hydra'}",)):  # dry run and real run alike
        code, out, err = ebpo_train(monkeypatch, capsys, *args, where, "algorithm.ebpo.decay=0.8")
        assert code == 2 and out == ""
        [line] = _error_lines(err)
        assert line.startswith(f"ebpo-train: error: algorithm.ebpo differs from the checkpoint's options in {folder}")
        for part in ("decay: 0.9 -> 0.8", "algorithm.ebpo.decay=0.9", "mismatch=reset", "mismatch=keep"):
            assert part in line
        assert "Traceback" not in err and "pre-flight: ok" not in err
    # the ways out pass the pre-flight; resume_mode=disable or a fresh folder has nothing to compare
    for extra in ("algorithm.ebpo.on_resume_mismatch=reset", "trainer.resume_mode=disable"):
        code, _, err = ebpo_train(monkeypatch, capsys, "--cfg", "job", where, "algorithm.ebpo.decay=0.8", extra)
        assert code == 0, err
    # resume_mode=resume_path reads that folder; an unreadable state file stops too, naming it
    (folder / "ebpo_state.json").write_text("{")
    code, _, err = ebpo_train(
        monkeypatch, capsys, "--cfg", "job", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={folder}"
    )
    assert code == 2 and f"EBPO state file {folder / 'ebpo_state.json'} is unreadable" in err


def test_main_preflight_checks_the_spo_tracker_of_a_resume(monkeypatch, capsys, tmp_path):
    ckpt = tmp_path / "ckpt"
    _checkpoint(ckpt, 2, spo=SPOOptions(rho=0.9))
    args = ("--cfg", "job", "algorithm.adv_estimator=spo", f"trainer.default_local_dir={ckpt}")
    code, _, err = ebpo_train(monkeypatch, capsys, *args, "algorithm.spo.rho=0.5")
    [line] = _error_lines(err)
    assert code == 2 and "algorithm.spo differs" in line and "rho: 0.9 -> 0.5" in line
    keep = "algorithm.spo.on_resume_mismatch=keep"
    code, _, err = ebpo_train(monkeypatch, capsys, *args, "algorithm.spo.rho=0.5", keep)
    assert code == 0, err


def test_main_parses_the_run_options_once_and_hands_the_trainers_on(monkeypatch, capsys, tmp_path):
    """A real run parses ``RunOptions`` once in the driver (the pre-flight's) and launches with its ``trainer``
    options, the environment's timeout applied (Ray and verl stubbed: the launch is where they would start)."""
    from ebpo_verl import main as entry
    from ebpo_verl.trainer import run_options

    parses, launched = [], []
    real = run_options.RunOptions.from_config.__func__
    monkeypatch.setattr(run_options.RunOptions, "from_config", classmethod(lambda c, k: parses.append(1) or real(c, k)))
    monkeypatch.setattr(entry, "_launch", lambda config, trainer: launched.append(trainer))
    monkeypatch.setenv("EBPO_STEP_TIMEOUT_S", "90")
    rows = _parquet(tmp_path / "rows.parquet", 8)
    data = [f"data.train_files={rows}", f"data.val_files={rows}", "data.train_batch_size=8"]
    code, _, err = ebpo_train(monkeypatch, capsys, *data, "actor_rollout_ref.actor.ppo_mini_batch_size=8")
    assert code == 0, err
    assert len(parses) == 1 and len(launched) == 1
    assert (launched[0].step_timeout_s, launched[0].init_timeout_s) == (90.0, 3600)


def test_the_command_line_is_parsed_once_into_a_command():
    """ebpo-train's own flags and the overrides become one Command; Hydra's own command lines are left to Hydra."""
    from ebpo_verl.main import Command, arguments

    assert arguments(["a=1", "--cfg", "job", "-p", "trainer", "--resolve", "-cn=mine", "b=2"]) == Command(
        ("a=1", "b=2"), cfg="job", package="trainer", resolve=True, config_name="mine"
    )
    assert arguments(["-h"]) == Command(help=True) and arguments([]) == Command()
    assert arguments(["--cfg", "hydra"]) is None and arguments(["--multirun", "a=1"]) is None
