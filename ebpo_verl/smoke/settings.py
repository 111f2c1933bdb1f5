"""What the smoke runs train on and with which overrides: the data, the tiny model, verl's Hydra overrides for
one run (CPU or ``--device cuda``, HF or vLLM rollout, one node or the two-node cluster)."""

from __future__ import annotations

import math
from pathlib import Path

from ebpo_verl.cpu.switches import BackendSwitches
from ebpo_verl.smoke import reward

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO.parent / "shared" / "data"
# the real MATH-500/AMC23 copies beside the repository, else (a clone without them) the tests' made-up rows
DATA = SHARED_DATA if SHARED_DATA.is_dir() else REPO / "tests" / "fixtures" / "hub"
STEPS, SAVE_FREQ, BATCH, N, VAL_N, TOPICS = 3, 2, 4, 4, 2, 6
EBPO_KEYS = tuple(
    f"ebpo/{name}"
    for name in "shrinkage_mean shrinkage_min shrinkage_max mu_glob sigma2 tau2 prompts_seen frac_zero_var_groups "
    "frac_all_fail frac_all_pass".split()
)
VAL_KEY = f"val-core/amc23/acc/mean@{VAL_N}"
TEST_FREQ = SAVE_FREQ  # one node: validation at step 2 and at the last step
K_STEPS = STEPS + 1  # runs K/K': resumed from A's step 2, killed in step 3's validation, then step 4
VLLM_STEPS = STEPS + 1  # run C: steps 3 and 4 after resuming from step 2
NODES = 2  # --nodes 2: a head and a second Ray node, one GPU-resource (one FSDP rank, one vLLM replica) each
DEVICES = ("cpu", "cuda")
BACKEND = "ebpo_verl.cpu.backend"
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
ROLLOUTS = {
    "hf": ["actor_rollout_ref.rollout.name=hf"],
    "vllm": [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.enforce_eager=True",
        "+actor_rollout_ref.rollout.enable_sleep_mode=False",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
        f"{ENV_VARS}.VLLM_CPU_KVCACHE_SPACE='1'",  # GiB, a string
    ],
}
"""The rollout backends: the CPU backend's Hugging Face server (``hf``), verl's vLLM rollout on vLLM's CPU build
(``vllm``: eager, a 1 GiB KV cache, no sleep mode)."""


def run_env(device: str = "cpu") -> dict[str, str]:
    """Environment of a run's processes: ``VERL_PLATFORM=cpu`` on CPU; on CUDA verl's own platform."""
    return {**RUN_ENV, "VERL_PLATFORM": "cpu"} if device == "cpu" else dict(RUN_ENV)


def prepare(work: Path) -> dict:
    """Tiny model + tokenizer, and the train/val parquet subsets, under ``work``."""
    import pyarrow.parquet as pq

    from ebpo_verl.cpu.tiny import build_model, build_tokenizer
    from ebpo_verl.data import amc23, math500
    from ebpo_verl.data.schema import write_parquet_atomic

    raw = work / "raw"
    full_train = pq.read_table(math500.prepare(raw, local_path=DATA / "math500.jsonl"))
    full_val = pq.read_table(amc23.prepare(raw, local_path=DATA / "amc23.jsonl"))

    # 4 of the shortest problems of each of the 6 topics with the most short problems: aligned topic blocks
    prompts = [p[0]["content"] for p in full_train.column("prompt").to_pylist()]
    topics = [e["topic"] for e in full_train.column("extra_info").to_pylist()]
    by_topic: dict[str, list[int]] = {}
    for i in sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i)):
        by_topic.setdefault(topics[i], []).append(i)
    chosen = sorted(by_topic, key=lambda t: (-len(by_topic[t]), t))[:TOPICS]
    rows = sorted(i for t in chosen for i in by_topic[t][:BATCH])
    train = write_parquet_atomic(full_train.take(rows), work / "train.parquet")
    val_texts = [p[0]["content"] for p in full_val.column("prompt").to_pylist()]
    val_rows = sorted(sorted(range(len(val_texts)), key=lambda i: (len(val_texts[i]), i))[:8])
    val = write_parquet_atomic(full_val.take(val_rows), work / "val.parquet")

    tokenizer = build_tokenizer(work / "model", corpus=prompts + val_texts)
    build_model(work / "model", tokenizer)
    messages = pq.read_table(train).column("prompt").to_pylist() + pq.read_table(val).column("prompt").to_pylist()
    longest = max(
        len(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
        for m in messages
    )
    return {"train": train, "val": val, "model": work / "model", "prompt_length": longest}


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


def overrides(
    work: Path,
    files: dict,
    run: str,
    ray_tmp: str,
    rollout: str = "hf",
    steps: int = STEPS,
    cluster: str | None = None,
    device: str = "cpu",
) -> list[str]:
    """Hydra overrides of one run of ``steps`` steps: on its own one-node Ray instance, or with ``cluster`` (a GCS
    address) on that two-node cluster."""
    ranks = 1 if cluster is None else NODES
    return [
        *tiny_trainer_overrides(files, BATCH, N, ranks),
        "data.custom_cls.path=pkg://ebpo_verl.trainer.curriculum",
        "data.custom_cls.name=CurriculumDataset",
        "+data.curriculum.order=topic",
        *ROLLOUTS[rollout],
        f"actor_rollout_ref.rollout.val_kwargs.n={VAL_N}",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        f"reward.custom_reward_function.path={Path(reward.__file__).resolve()}",
        "reward.custom_reward_function.name=coin_score",
        "trainer.logger=[console]",
        "trainer.project_name=cpu_smoke",
        f"trainer.experiment_name={run}",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={SAVE_FREQ}",
        f"trainer.test_freq={TEST_FREQ if cluster is None else STEPS}",
        f"trainer.default_local_dir={work / f'ckpt_{run}'}",
        f"trainer.rollout_data_dir={work / f'rollouts_{run}'}",
        *logger_overrides(work / f"ckpt_{run}"),
        *ray_overrides(ray_tmp, cluster),
        *device_overrides(device),
    ]
