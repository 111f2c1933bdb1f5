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

Usage: ``python -m benchmarks.bench_step_cost --help``; under ``flock /tmp/heavy.lock`` on a shared machine.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar

import psutil

from ebpo_verl.cpu import rewards
from ebpo_verl.cpu.tiny_runs import (
    DATA,
    device_overrides,
    logger_overrides,
    ray_overrides,
    run_env,
    tiny_trainer_overrides,
)
from ebpo_verl.ops.metrics_log import read_metrics_log
from ebpo_verl.options.cli import OneLineParser, add_options, parse_options
from ebpo_verl.options.parsing import PATH, OptionSection, ints, option, text

REPO = Path(__file__).resolve().parents[1]
BATCH, N, PROMPTS = 8, 4, 16
ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONPATH": str(REPO)}  # beside the smoke runs' run_env
ENTRIES = {"grpo": "verl.trainer.main_ppo", "ebpo": "ebpo_verl.main", "dbb": "ebpo_verl.main"}


def prepare(work: Path) -> dict[str, str]:
    """A tiny Qwen3 + tokenizer and the ``PROMPTS`` shortest MATH-500 problems as train (and val) parquet."""
    import pyarrow.parquet as pq

    from ebpo_verl.cpu.tiny import build_model, build_tokenizer
    from ebpo_verl.data import math500
    from ebpo_verl.data.schema import write_parquet_atomic

    table = pq.read_table(math500.prepare(work / "raw", local_path=DATA / "math500.jsonl"))  # the smoke runs' copy
    texts = [p[0]["content"] for p in table.column("prompt").to_pylist()]
    rows = sorted(sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))[:PROMPTS])
    train = write_parquet_atomic(table.take(rows), work / "train.parquet")
    tokenizer = build_tokenizer(work / "model", corpus=texts)
    build_model(work / "model", tokenizer)
    chats = table.take(rows).column("prompt").to_pylist()
    longest = max(len(tokenizer.apply_chat_template(c, add_generation_prompt=True, return_dict=True)["input_ids"])
                  for c in chats)  # fmt: skip
    return {"train": str(train), "val": str(train), "model": str(work / "model"), "prompt_length": longest}


def tiny_run(work: Path, files: dict, name: str, estimator: str, steps: int, save_freq: int = 1,
             loggers: str = "[console,file]", extra: tuple = (), timeout: float = 900) -> int:  # fmt: skip
    """One trainer start (``ENTRIES[estimator]``, in a session of its own, output appended to ``work/<name>.log``)
    on a private Ray instance, one node, one rank: the smoke runs' tiny configuration
    (:func:`ebpo_verl.cpu.tiny_runs.tiny_trainer_overrides`) with the parity reward of :mod:`ebpo_verl.cpu.rewards`,
    no validation and verl's loggers writing under its checkpoint folder ``work/ckpt_<name>``; past ``timeout``
    seconds it is killed and this raises. Returns the exit status."""
    out, ray_tmp = work / f"ckpt_{name}", tempfile.mkdtemp(prefix="ebpo-bench-", dir="/tmp")  # short socket paths
    args = [
        *tiny_trainer_overrides(files, BATCH, N),
        f"algorithm.adv_estimator={estimator}",
        "actor_rollout_ref.rollout.name=hf",
        f"reward.custom_reward_function.path={Path(rewards.__file__).resolve()}",
        "reward.custom_reward_function.name=parity_reward",
        f"trainer.logger={loggers}",
        "trainer.project_name=bench",
        f"trainer.experiment_name={name}",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={save_freq}",
        "trainer.test_freq=-1",
        f"trainer.default_local_dir={out}",
        *device_overrides("cpu"),
        *logger_overrides(out),
        *ray_overrides(ray_tmp),
        *extra,
    ]
    out.mkdir(parents=True, exist_ok=True)  # verl's file logger does not create it
    env = {**os.environ, **run_env("cpu"), **ENV}
    env.pop("RAY_ADDRESS", None)  # its own Ray instance, never one this shell points at
    with open(work / f"{name}.log", "a") as log:
        proc = subprocess.Popen([sys.executable, "-m", ENTRIES[estimator], *args], cwd=work, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"run {name} exceeded {timeout:.0f}s; see {work / f'{name}.log'}") from None
    finally:
        kill_session(proc)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL what a run left (Ray's processes, its workers): its descendants and its session's process group."""
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(tree, timeout=60)
    proc.wait(timeout=60)


# ------------------------------------------------------------------------------------------- the benchmark
def bootstrap_ci(values: list[float], reps: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median of ``values``."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(reps))
    return medians[int(0.025 * reps)], medians[int(0.975 * reps) - 1]


def phase_medians(runs: list[dict[int, dict]], checkpoint) -> dict[str, float]:
    """Median of every ``timing_s/*`` metric over the steps after step 1 of ``runs`` without a checkpoint
    (``checkpoint(step)`` false); ``... (checkpoint steps)``: the step and the save over those with one."""
    steps = [(n, s) for run in runs for n, s in run.items() if n > 1]
    plain = [s for n, s in steps if not checkpoint(n)]
    saving = [s for n, s in steps if checkpoint(n)]
    keys = sorted({k for s in plain for k in s if k.startswith("timing_s/")})
    out = {k: statistics.median(s[k] for s in plain if k in s) for k in keys}
    for key in ("timing_s/step", "timing_s/save_checkpoint"):
        if values := [s[key] for s in saving if key in s]:
            out[f"{key} (checkpoint steps)"] = statistics.median(values)
    return out


def direct_timings() -> dict[str, float]:
    """Milliseconds per call of what ebpo-train adds, measured in this process on realistic sizes."""
    from ebpo_verl.ops.metrics_log import MetricsLog
    from ebpo_verl.trainer.ray_trainer import extra_info_values

    out = {}
    rows = 512 * 16  # a paper-size step: 512 prompts x 16 responses
    infos = [{"index": i // 16, "topic": f"t{i % 7}"} for i in range(rows)]
    uids = [f"u{i // 16}" for i in range(rows)]
    out["row-key map, 8192 rows (ms)"] = _time(
        lambda: extra_info_values(infos, uids, [False] * rows, "index", "prompt key")
    )
    metrics = {f"group/metric_{i}": float(i) for i in range(200)}
    with tempfile.TemporaryDirectory() as tmp:
        log = MetricsLog(Path(tmp) / "m.jsonl", resumed_step=0)
        out["metrics log, one 200-key line (ms)"] = _time(lambda: log.log(metrics, step=1))
        out.update(_state_save_timings(Path(tmp)))
    out.update(_watchdog_timing())
    return out


def _time(call, repeats: int = 20) -> float:
    return 1e3 * statistics.median(timeit.repeat(call, number=1, repeat=repeats))


def _state_save_timings(tmp: Path) -> dict[str, float]:
    """``save_state`` of EBPO's state after 50 steps of 512 prompts x 16, and of DBB's holding 40,000 prompts."""
    import numpy as np
    import torch

    from ebpo_verl.algos import registry
    from ebpo_verl.main import compose
    from ebpo_verl.trainer.adapter import outcome_advantages
    from ebpo_verl.trainer.checkpoint.state import save_state
    from ebpo_verl.trainer.run_options import RunOptions

    out = {}
    rng = np.random.default_rng(0)
    for name, prompts, steps in (("ebpo", 512, 50), ("dbb", 40_000, 1)):
        options = RunOptions.from_config(compose([f"algorithm.adv_estimator={name}"]))
        entry = options.stateful
        estimator = registry.new_estimator(entry, options.estimator)  # the run's estimator, as the trainer's
        index = np.repeat(np.arange(prompts), 16)
        uids = np.array([f"u{i}" for i in index], dtype=object)
        source = entry.row_source(options.estimator)  # ebpo reads nothing, dbb the prompt key
        values = None if source is None or source.sample_index else index.astype(object)
        rewards = torch.zeros(len(index), 4)
        mask = torch.ones_like(rewards)
        for _ in range(steps):
            rewards[:, -1] = torch.from_numpy(rng.integers(0, 2, len(index))).float()
            outcome_advantages(estimator, rewards, mask, uids, values)
        path = save_state(entry, tmp, estimator.state, options.estimator, steps)
        label = f"{name} state save, {path.stat().st_size / 1024:.0f} KiB file (ms)"
        out[label] = _time(partial(save_state, entry, tmp, estimator.state, options.estimator, steps), repeats=5)
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


# ------------------------------------------------------------------------------------------------ the report
def is_checkpoint_step(step: int, steps: int, save_freq: int) -> bool:
    """verl saves every ``save_freq`` steps and at the last step."""
    return step % save_freq == 0 or step == steps


def report(runs: dict[str, list[dict]], steps: int, save_freq: int) -> list[str]:
    """The phase medians per estimator and the paired step-time ratios against grpo."""
    checkpoint = partial(is_checkpoint_step, steps=steps, save_freq=save_freq)
    medians = {name: phase_medians(each, checkpoint) for name, each in runs.items()}
    keys = sorted(set().union(*medians.values()))
    counts = ", ".join(f"{n}: {len(r)} runs" for n, r in runs.items())
    lines = [f"phase medians (s, steps 2.. without a checkpoint unless said; {counts})"]
    lines.append(f"  {'timing_s/*':<46}" + "".join(f"{name:>10}" for name in runs))
    for key in keys:
        lines.append(f"  {key:<46}" + "".join(f"{medians[n].get(key, float('nan')):>10.3f}" for n in runs))
    for name in [n for n in runs if n != "grpo"]:
        pairs = {"no checkpoint": [], "checkpoint": []}
        for base, other in zip(runs["grpo"], runs[name], strict=True):
            for step in sorted(set(base) & set(other)):
                if step > 1:
                    kind = "checkpoint" if checkpoint(step) else "no checkpoint"
                    pairs[kind].append(other[step]["timing_s/step"] / base[step]["timing_s/step"])
        for kind, ratios in pairs.items():
            low, high = bootstrap_ci(ratios) if ratios else (float("nan"), float("nan"))
            lines.append(f"{name}/grpo step time, {kind} steps: median {statistics.median(ratios):.3f} "
                         f"[95% {low:.3f}, {high:.3f}] over {len(ratios)} paired steps")  # fmt: skip
    return lines


def state_sizes(work: Path, runs: list[str]) -> list[str]:
    """Size of every estimator state file the runs' checkpoints hold (the last checkpoint of each run)."""
    files = {name: (work / f"ckpt_{name}").glob("global_step_*/*_state.json") for name in runs}
    last = {
        name: max(found, key=lambda p: int(p.parent.name.rsplit("_", 1)[1]), default=None)
        for name, found in files.items()
    }
    return [
        f"{name}: {path.parent.name}/{path.name} {path.stat().st_size} bytes" for name, path in last.items() if path
    ]


def figure(work: Path, files: dict, steps: int, out: Path) -> None:
    """One ``steps``-step ebpo run with TensorBoard; its ``ebpo/*`` curves, read from the event files, to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if code := tiny_run(work, files, "figure", "ebpo", steps, save_freq=steps, loggers="[console,tensorboard]"):
        raise SystemExit(f"the figure run failed (exit {code}); see {work / 'figure.log'}")
    acc = EventAccumulator(str(work / "ckpt_figure" / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    groups = [("ebpo/shrinkage_mean", "ebpo/shrinkage_min", "ebpo/shrinkage_max"), ("ebpo/mu_glob",),
              ("ebpo/sigma2", "ebpo/tau2"), ("ebpo/frac_zero_var_groups", "ebpo/frac_all_fail", "ebpo/frac_all_pass"),
              ("ebpo/prompts_seen",)]  # fmt: skip
    fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 2.6))
    for ax, tags in zip(axes, groups, strict=True):
        for tag in tags:
            points = acc.Scalars(tag)
            ax.plot([p.step for p in points], [p.value for p in points], label=tag.removeprefix("ebpo/"))
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.suptitle(f"ebpo/* curves of a {steps}-step CPU run (tiny Qwen3, 8 prompts x 4, parity reward)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    print(f"figure: {out}")


@dataclass(frozen=True)
class BenchOptions(OptionSection):
    """The benchmark's options, declared once."""

    SECTION: ClassVar[str] = "bench_step_cost"

    rounds: int = option(2, "interleaved rounds of the estimators", rule=ints(1))
    steps: int = option(6, "training steps per run", rule=ints(1))
    save_freq: int = option(3, "a checkpoint every N steps", rule=ints(1))
    estimators: str = option(
        "grpo,ebpo,dbb", "comma separated, grpo first: the ratios are against it", rule=text("names")
    )
    work_dir: str | None = option(None, "folder of the runs; null: a new temp folder", choices=(None,), rule=PATH)
    figure: str | None = option(None, "instead: draw the ebpo/* curves to this PNG", choices=(None,), rule=PATH)
    figure_steps: int = option(40, "steps of the run the figure draws", rule=ints(1))

    def __post_init__(self) -> None:
        super().__post_init__()
        kinds = {is_checkpoint_step(n, self.steps, self.save_freq) for n in range(2, self.steps + 1)}
        if not self.figure and kinds != {True, False}:
            raise ValueError(
                f"--rounds {self.rounds} --steps {self.steps} --save-freq {self.save_freq}: the ratios need a round "
                f"and, among steps 2..{self.steps} (step 1 warms up), a checkpoint step and a step without one (e.g. "
                "--steps 6 --save-freq 3)"
            )


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    add_options(parser, BenchOptions)
    options = parse_options(BenchOptions, parser.parse_args(argv), parser)
    work = Path(options.work_dir or tempfile.mkdtemp(prefix="bench-step-", dir="/tmp"))
    if not options.figure and (earlier := sorted(p.name for p in work.glob("ckpt_*"))):
        parser.error(f"--work-dir {work} holds earlier runs ({', '.join(earlier)}), which verl would resume "
                     "instead of timing: give a new folder")  # fmt: skip
    work.mkdir(parents=True, exist_ok=True)
    files = prepare(work)
    if options.figure:
        figure(work, files, options.figure_steps, Path(options.figure).resolve())
        return
    names = options.estimators.split(",")
    if names[0] != "grpo" or not set(names) <= set(ENTRIES):
        raise SystemExit(f"--estimators: grpo first, then any of {sorted(ENTRIES)}; got {options.estimators}")
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(options.rounds):
        for name in names:
            start = time.monotonic()
            if code := tiny_run(work, files, f"{name}_r{r}", name, options.steps, options.save_freq):
                raise SystemExit(f"run {name}_r{r} failed (exit {code}); see {work / f'{name}_r{r}.log'}")
            runs[name].append(read_metrics_log(work / f"ckpt_{name}_r{r}" / "verl_file_log.jsonl"))
            print(f"run {name}_r{r}: {time.monotonic() - start:.0f} s", flush=True)
    print(f"{options.rounds} rounds x {options.steps} steps, checkpoint every {options.save_freq} and at the last step")
    print("\n".join(report(runs, options.steps, options.save_freq)))
    print("state files:", "; ".join(state_sizes(work, [f"{n}_r0" for n in names])))
    print("direct timings, in this process:")
    for key, ms in direct_timings().items():
        print(f"  {key:<58} {ms:9.3f}")


if __name__ == "__main__":
    main()
