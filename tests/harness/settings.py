"""What the smoke runs train on and with which overrides: the data, the tiny model, verl's Hydra overrides for
one run (CPU or ``--device cuda``, HF or vLLM rollout, one node or the two-node cluster), on the tiny-run settings
they share with ``benchmarks/bench_step_cost.py`` (:mod:`ebpo_verl.cpu.tiny_runs`)."""

from __future__ import annotations

from pathlib import Path

from ebpo_verl.cpu import rewards
from ebpo_verl.cpu.tiny_runs import (
    DATA,
    ENV_VARS,
    device_overrides,
    logger_overrides,
    ray_overrides,
    tiny_trainer_overrides,
)

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
        f"reward.custom_reward_function.path={Path(rewards.__file__).resolve()}",
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
