"""What ebpo-train costs per training step against stock verl GRPO, on verl's real trainer on CPU.

Runs the same tiny configuration (a 50k-parameter Qwen3, 8 MATH-500 prompts x ``rollout.n=4`` per step, the
CPU backend's HF rollout) through stock ``python -m verl.trainer.main_ppo`` with ``algorithm.adv_estimator=grpo``
and through ``python -m ebpo_verl.main`` (``ebpo-train``) with ``ebpo`` and ``dbb``, interleaved (round r runs
grpo, ebpo, dbb, then the next round), every run with verl's ``file`` logger. It prints, from verl's own timing
metrics (``timing_s/*``), the median of every phase per estimator, and the paired ratio of each step's
``timing_s/step`` to grpo's same step of the same round (median, and a bootstrap 95% interval), separately for
steps with and without a checkpoint (step 1, which warms up, is left out), the EB state file's size, and
direct in-process timings of what ebpo-train adds (the row-key map, the state save, the watchdog thread's look at
Ray's actor table, the metrics log).

Usage: ``python benchmarks/bench_step_cost.py [--rounds 2] [--steps 6] [--save-freq 2] [--work-dir DIR]``; run
it under ``flock /tmp/heavy.lock`` on a shared machine. ``tiny_run`` and the helpers above it are also the
launcher of ``tests/test_tracking.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "math500.jsonl"
FIXTURE = REPO / "tests" / "fixtures" / "hub" / "math500.jsonl"
BATCH, N, PROMPTS = 8, 4, 16
ENV = {
    "VERL_USE_EXTERNAL_MODULES": "ebpo_verl.cpu.backend",
    "VERL_PLATFORM": "cpu",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
    "RAY_DEDUP_LOGS": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
}
ENTRIES = {"grpo": "verl.trainer.main_ppo", "ebpo": "ebpo_verl.main", "dbb": "ebpo_verl.main"}


def parity_reward(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """Benchmark reward: the parity of the response's CRC-32 (deterministic; mixed groups from a random model)."""
    return float(zlib.crc32(solution_str.encode("utf-8")) & 1)


def prepare(work: Path) -> dict[str, str]:
    """A tiny Qwen3 + tokenizer and the ``PROMPTS`` shortest MATH-500 problems as train (and val) parquet."""
    import pyarrow.parquet as pq

    from data_prep import math500
    from data_prep.schema import write_parquet_atomic
    from ebpo_verl.cpu.tiny import build_model, build_tokenizer

    source = DATA if DATA.is_file() else FIXTURE
    table = pq.read_table(math500.prepare(work / "raw", local_path=source))
    texts = [p[0]["content"] for p in table.column("prompt").to_pylist()]
    rows = sorted(sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))[:PROMPTS])
    train = write_parquet_atomic(table.take(rows), work / "train.parquet")
    tokenizer = build_tokenizer(work / "model", corpus=texts)
    build_model(work / "model", tokenizer)
    longest = max(len(tokenizer.apply_chat_template(table.column("prompt")[i].as_py(), add_generation_prompt=True))
                  for i in rows)  # fmt: skip
    return {"train": str(train), "model": str(work / "model"), "prompt_length": str(64 * (longest // 64 + 1))}


def overrides(work: Path, files: dict, name: str, estimator: str, steps: int, save_freq: int, loggers: str) -> list:
    """Hydra overrides of one run ``name`` (its checkpoint folder ``work/ckpt_<name>``), one node, one rank."""
    out = work / f"ckpt_{name}"
    micro = BATCH * N
    return [
        f"algorithm.adv_estimator={estimator}",
        f"data.train_files={files['train']}",
        f"data.val_files={files['train']}",
        f"data.train_batch_size={BATCH}",
        f"data.max_prompt_length={files['prompt_length']}",
        "data.max_response_length=16",
        "data.shuffle=False",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={files['model']}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "algorithm.use_kl_in_reward=False",
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.rollout.n={N}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"reward.custom_reward_function.path={Path(__file__).resolve()}",
        "reward.custom_reward_function.name=parity_reward",
        "reward.num_workers=1",
        "trainer.device=cpu",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        f"trainer.logger={loggers}",
        "trainer.project_name=bench",
        f"trainer.experiment_name={name}",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={save_freq}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        f"trainer.default_local_dir={out}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "ray_kwargs.ray_init.num_cpus=8",
        "+ray_kwargs.ray_init.num_gpus=1",
        "+ray_kwargs.ray_init.include_dashboard=False",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES={ENV['VERL_USE_EXTERNAL_MODULES']}",
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM=cpu",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={out}/verl_file_log.jsonl",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.TENSORBOARD_DIR={out}/tensorboard",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_DIR={out}",
        "+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE=offline",
    ]


def tiny_run(work: Path, files: dict, name: str, estimator: str, steps: int, save_freq: int = 1,
             loggers: str = "[console,file]", extra: tuple = (), timeout: float = 900,
             kill_when=None) -> int:  # fmt: skip
    """One trainer start (``ENTRIES[estimator]``) in a session of its own on a private Ray instance; its output
    appended to ``work/<name>.log``. ``kill_when(ckpt_folder)`` true: the process group is SIGKILLed (a crash);
    past ``timeout`` seconds it is killed and this raises. Returns the exit status (-9 when killed)."""
    ray_tmp = tempfile.mkdtemp(prefix="ebpo-bench-", dir="/tmp")  # Ray's socket paths must stay short
    args = overrides(work, files, name, estimator, steps, save_freq, loggers) + [
        f"+ray_kwargs.ray_init._temp_dir={ray_tmp}", *extra]  # fmt: skip
    env = {**os.environ, **ENV, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    with open(work / f"{name}.log", "a") as log:
        proc = subprocess.Popen([sys.executable, "-m", ENTRIES[estimator], *args], cwd=work, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            if kill_when is not None and kill_when(work / f"ckpt_{name}"):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return -9
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                raise RuntimeError(f"run {name} exceeded {timeout:.0f}s; see {work / f'{name}.log'}")
            time.sleep(0.2)
        return proc.returncode
    finally:
        _kill_group(proc.pid)
        subprocess.run(["rm", "-rf", ray_tmp], check=False)


def _kill_group(pgid: int) -> None:
    """What is left of a run's session (Ray's raylet and workers outlive the driver briefly)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def read_jsonl(path: Path) -> dict[int, dict]:
    """verl's file-logger / metrics-log records merged per step."""
    out: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        out.setdefault(int(record["step"]), {}).update(record["data"])
    return out


# ------------------------------------------------------------------------------------------- the benchmark
def bootstrap_ci(values: list[float], reps: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median of ``values``."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(reps))
    return medians[int(0.025 * reps)], medians[int(0.975 * reps) - 1]


def phase_medians(runs: list[dict[int, dict]]) -> dict[str, float]:
    """Median of every ``timing_s/*`` metric over the steps (after step 1) of ``runs``."""
    keys = sorted({k for run in runs for step in run.values() for k in step if k.startswith("timing_s/")})
    return {k: statistics.median(s[k] for run in runs for n, s in run.items() if n > 1 and k in s) for k in keys}


def paired_ratios(base: list[dict], other: list[dict], save_freq: int) -> dict[str, list[float]]:
    """``timing_s/step`` of ``other`` over ``base``, same round and step, split by checkpoint / no checkpoint."""
    out: dict[str, list[float]] = {"no checkpoint": [], "checkpoint": []}
    for a, b in zip(base, other, strict=True):
        for step in sorted(set(a) & set(b)):
            if step > 1 and "timing_s/step" in a[step] and "timing_s/step" in b[step]:
                kind = "checkpoint" if step % save_freq == 0 else "no checkpoint"
                out[kind].append(b[step]["timing_s/step"] / a[step]["timing_s/step"])
    return out


def direct_timings() -> dict[str, float]:
    """Milliseconds per call of what ebpo-train adds, measured in this process on realistic sizes."""
    from ebpo_verl.ops.metrics_log import MetricsLog
    from ebpo_verl.trainer.ray_trainer import uid_row_keys

    out = {}
    rows = 512 * 16  # a paper-size step: 512 prompts x 16 responses
    infos = [{"index": i // 16, "topic": f"t{i % 7}"} for i in range(rows)]
    uids = [f"u{i // 16}" for i in range(rows)]
    out["row-key map, 8192 rows (ms)"] = _time(lambda: uid_row_keys(infos, uids, [False] * rows, "index"))
    metrics = {f"group/metric_{i}": float(i) for i in range(200)}
    with tempfile.TemporaryDirectory() as tmp:
        log = MetricsLog(Path(tmp) / "m.jsonl", resumed_step=0)
        out["metrics log, one 200-key line (ms)"] = _time(lambda: log.log(metrics, step=1))
        out.update(_state_save_timings(Path(tmp)))
    out.update(_watchdog_timing())
    return out


def _time(call, repeats: int = 20) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _state_save_timings(tmp: Path) -> dict[str, float]:
    """``save_state`` of EBPO's state after 50 steps of 512 prompts x 16, and of DBB's holding 40,000 prompts."""
    import numpy as np
    import torch
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from ebpo_verl.main import compose
    from ebpo_verl.trainer.adapter import StepInputs, step_inputs
    from ebpo_verl.trainer.checkpoint.state import save_state
    from ebpo_verl.trainer.run_options import RunOptions

    out = {}
    rng = np.random.default_rng(0)
    for name, prompts, steps in (("ebpo", 512, 50), ("dbb", 40_000, 1)):
        options = RunOptions.from_config(compose([f"algorithm.adv_estimator={name}"]))
        entry = options.stateful
        entry.state.reset()
        index = np.repeat(np.arange(prompts), 16)
        uids = np.array([f"u{i}" for i in index], dtype=object)
        rows = {f"u{i}": int(i) for i in range(prompts)} if options.row_key else None
        rewards = torch.zeros(len(index), 4)
        mask = torch.ones_like(rewards)
        estimator = get_adv_estimator_fn(name)
        for _ in range(steps):
            rewards[:, -1] = torch.from_numpy(rng.integers(0, 2, len(index))).float()
            with step_inputs(StepInputs(options.estimator, rows)):
                estimator(token_level_rewards=rewards, response_mask=mask, index=uids, config=None)
        path = save_state(entry, tmp, entry.state, options.estimator, steps)
        label = f"{name} state save, {path.stat().st_size / 1024:.0f} KiB file (ms)"
        out[label] = _time(lambda e=entry, o=options, n=steps: save_state(e, tmp, e.state, o.estimator, n), repeats=5)
    return out


def _watchdog_timing() -> dict[str, float]:
    """The watchdog thread's periodic look at Ray's actor table (every DEATH_CHECK_S s), on a local Ray."""
    import ray

    from ebpo_verl.trainer.watchdog import DEATH_CHECK_S, dead_actors

    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
    try:
        dead_actors(time.time())  # the state API's first call connects
        ms = _time(lambda: dead_actors(time.time()), repeats=10)
    finally:
        ray.shutdown()
    return {f"watchdog look at the actor table (ms, every {DEATH_CHECK_S} s)": ms}
