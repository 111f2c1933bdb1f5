"""What every tiny run of verl's trainer on this machine shares (the smoke runs, the GPU self-check's ``train``
check, ``benchmarks/bench_step_cost.py``): the data beside the checkout, the environment of a run's processes and
verl's Hydra overrides for the tiny model on FSDP2, its device, its private Ray instance and its loggers."""

from __future__ import annotations

import math
from pathlib import Path

from ebpo_verl.cpu.switches import BackendSwitches

REPO = Path(__file__).resolve().parents[2]
"""The checkout this file is in (the data below are a checkout's, not the wheel's)."""
SHARED_DATA = REPO.parent / "shared" / "data"
# the real MATH-500/AMC23 copies beside the repository, else (a clone without them) the tests' made-up rows
DATA = SHARED_DATA if SHARED_DATA.is_dir() else REPO / "tests" / "fixtures" / "hub"
BACKEND = "ebpo_verl.cpu.backend"
DEVICES = ("cpu", "cuda")
"""Where a tiny run trains: the CPU backend, or one CUDA GPU."""
ENV_VARS = "+ray_kwargs.ray_init.runtime_env.env_vars"  # <ENV_VARS>.NAME=value: in every process of the Ray job
RUN_ENV = {
    "VERL_USE_EXTERNAL_MODULES": BACKEND,
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
    "RAY_DEDUP_LOGS": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",  # never pick up a ~/.ray/auth_token another instance left
    # a raylet kills the children of a worker that died (a SIGKILLed vLLM server's engine processes), as it
    # does for workers that exit: Ray's own setting, for every cluster (docs/training.md)
    "RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper": "true",
}


def run_env(device: str = "cpu") -> dict[str, str]:
    """Environment of a run's processes: ``VERL_PLATFORM=cpu`` on CPU; on CUDA verl's own platform."""
    return {**RUN_ENV, "VERL_PLATFORM": "cpu"} if device == "cpu" else dict(RUN_ENV)


def device_overrides(device: str) -> list[str]:
    """``cpu``: the CPU backend's platform (gloo). ``cuda``: verl's CUDA platform (NCCL), the ``hf`` rollout's model
    on the same GPU (``EBPO_HF_ROLLOUT_DEVICE=cuda``)."""
    out = [f"trainer.device={device}", f"{ENV_VARS}.VERL_USE_EXTERNAL_MODULES={BACKEND}"]
    if device == "cpu":
        return [*out, f"{ENV_VARS}.VERL_PLATFORM=cpu"]
    gpu = BackendSwitches(EBPO_HF_ROLLOUT_DEVICE="cuda")
    return [*out, *(f"{ENV_VARS}.{k}={v}" for k, v in vars(gpu).items() if v != BackendSwitches.defaults()[k])]


def ray_overrides(ray_tmp: str, cluster: str | None = None) -> list[str]:
    """A private Ray instance started by the run (its files under ``ray_tmp``, one GPU resource, no dashboard),
    or, with ``cluster`` (a GCS address), that running cluster."""
    if cluster is not None:
        return [f"+ray_kwargs.ray_init.address={cluster}"]
    return [
        "ray_kwargs.ray_init.num_cpus=8",
        "+ray_kwargs.ray_init.num_gpus=1",
        f"+ray_kwargs.ray_init._temp_dir={ray_tmp}",
        "+ray_kwargs.ray_init.include_dashboard=False",
    ]


def logger_overrides(folder: Path) -> list[str]:
    """Where verl's loggers (``trainer.logger``) write, under run folder ``folder``: the ``file`` logger's
    ``verl_file_log.jsonl``, TensorBoard's ``tensorboard/`` and W&B's offline ``wandb/`` (set in the Ray job's
    environment: verl's ``Tracking`` lives in its TaskRunner actor)."""
    return [
        f"{ENV_VARS}.VERL_FILE_LOGGER_PATH={folder}/verl_file_log.jsonl",
        f"{ENV_VARS}.TENSORBOARD_DIR={folder}/tensorboard",
        f"{ENV_VARS}.WANDB_DIR={folder}",
        f"{ENV_VARS}.WANDB_MODE=offline",
    ]


def tiny_trainer_overrides(files: dict, batch: int, n: int, ranks: int = 1) -> list[str]:
    """What every tiny run on verl's trainer shares (these smoke runs, ``benchmarks/bench_step_cost.py``): ``batch``
    prompts x ``n`` responses of <= 16 tokens a step, the tiny model on FSDP2 without KL, ``ranks`` one-rank nodes."""
    micro = batch * n // ranks
    return [
        f"data.train_files={files['train']}",
        f"data.val_files={files['val']}",
        f"data.train_batch_size={batch}",
        f"data.max_prompt_length={64 * math.ceil((int(files['prompt_length']) + 1) / 64)}",
        "data.max_response_length=16",
        "data.shuffle=False",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={files['model']}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",  # no reference model is built (no KL)
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "algorithm.use_kl_in_reward=False",
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        f"trainer.nnodes={ranks}",
        "trainer.n_gpus_per_node=1",
        "trainer.val_before_train=False",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
