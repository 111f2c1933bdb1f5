"""Run a preset's grid: one warm-started base model, then every (estimator, G, order, seed) RL run.

Runs are independent and deterministic for their seed (one torch thread each, a seeded generator, fresh EBPO
statistics), so they are spread over ``preset.workers`` forked processes and come back in any order.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ebpo_verl.study.policy import TinyPolicy, exact_pass_at_1, n_params
from ebpo_verl.study.presets import Preset
from ebpo_verl.study.rl import RLConfig, run_rl, warm_start
from ebpo_verl.study.tasks import ProblemSet, make_splits

BASE_SEED = 0  # the warm start (one "base model" shared by every run) and the data splits
PROBE_SIZE = 256


@dataclass
class Base:
    """The warm-started model and the data every run shares."""

    model: TinyPolicy
    train: ProblemSet
    heldout: ProblemSet
    probe: ProblemSet
    train_pass: np.ndarray  # (len(train),) exact pass@1 of the base model, for the difficulty order
    heldout_pass: np.ndarray
    sft_seconds: float
    sft_cpu_seconds: float


def prepare_base(preset: Preset) -> Base:
    """Data splits and the supervised warm start (``preset.sft_steps`` steps)."""
    splits = make_splits(preset.split_sizes, seed=BASE_SEED, topics=preset.topics)
    torch.manual_seed(BASE_SEED)
    model = TinyPolicy(preset.policy)
    t0, c0 = time.perf_counter(), time.process_time()
    warm_start(model, splits["sft"], preset.sft_steps, seed=BASE_SEED, misconception=preset.misconception)
    train, heldout = splits["train"], splits["heldout"]
    probe = train.subset(np.random.default_rng(BASE_SEED).permutation(len(train))[:PROBE_SIZE])
    return Base(
        model=model,
        train=train,
        heldout=heldout,
        probe=probe,
        train_pass=exact_pass_at_1(model, train.prompts, train.targets, train.target_mask).numpy(),
        heldout_pass=exact_pass_at_1(model, heldout.prompts, heldout.targets, heldout.target_mask).numpy(),
        sft_seconds=time.perf_counter() - t0,
        sft_cpu_seconds=time.process_time() - c0,
    )


def grid(preset: Preset) -> list[RLConfig]:
    """Every run of the preset: the main table (random order) and the ordering table, without duplicates."""
    cells = {(e, g, "random") for e in preset.estimators for g in preset.group_sizes}
    cells |= {(e, preset.order_group_size, o) for e in preset.order_estimators for o in preset.orders}
    return [
        RLConfig(estimator=e, group_size=g, order=o, seed=s, **preset.rl)
        for e, g, o in sorted(cells)
        for s in range(preset.seeds)
    ]


_BASE: Base | None = None  # set in the parent before forking; read by the workers


def _init_worker() -> None:
    torch.set_num_threads(1)


def _run_one(cfg: RLConfig) -> tuple[RLConfig, dict[str, list[float]], float, float]:
    assert _BASE is not None
    t0, c0 = time.perf_counter(), time.process_time()
    out = run_rl(_BASE.model, _BASE.train, _BASE.heldout, _BASE.train_pass, cfg, probe=_BASE.probe)
    return cfg, {k: v.tolist() for k, v in out.items()}, time.perf_counter() - t0, time.process_time() - c0


def run_grid(preset: Preset, base: Base, workers: int | None = None) -> list[dict]:
    """All runs of the preset, each as {"config": asdict(RLConfig), "metrics": {...}, "seconds": wall time,
    "cpu_seconds": CPU time of its process (what a dedicated core would need)}."""
    global _BASE
    _BASE = base
    jobs = grid(preset)
    workers = max(1, min(workers or preset.workers, len(jobs)))
    results = []
    bar = tqdm(total=len(jobs), desc=f"RL runs ({preset.name}, {workers} proc)", unit="run")
    if workers == 1:
        _init_worker()
        it = map(_run_one, jobs)
        pool = None
    else:
        pool = mp.get_context("fork").Pool(workers, initializer=_init_worker)
        it = pool.imap_unordered(_run_one, jobs)
    try:
        for cfg, metrics, seconds, cpu in it:
            results.append({"config": asdict(cfg), "metrics": metrics, "seconds": seconds, "cpu_seconds": cpu})
            bar.update()
    finally:
        bar.close()
        if pool is not None:
            pool.close()
            pool.join()
    position = {_key(asdict(c)): i for i, c in enumerate(jobs)}
    return sorted(results, key=lambda r: position[_key(r["config"])])


def _key(config: dict) -> tuple:
    return config["estimator"], config["group_size"], config["order"], config["seed"]


def describe_base(base: Base) -> dict:
    """Facts about the warm-started model for the report (pass-rate spread, parameter count)."""
    p, probe = base.train_pass, base.probe
    return {
        "params": n_params(base.model),
        "sft_seconds": base.sft_seconds,
        "sft_cpu_seconds": base.sft_cpu_seconds,
        "heldout_accuracy": float(base.heldout_pass.mean()),
        "probe_accuracy": float(exact_pass_at_1(base.model, probe.prompts, probe.targets, probe.target_mask).mean()),
        "train_accuracy": float(p.mean()),
        "frac_train_below_0.05": float((p < 0.05).mean()),
        "frac_train_above_0.95": float((p > 0.95).mean()),
        "pass_rate_histogram": np.histogram(p, bins=np.linspace(0, 1, 11))[0].tolist(),
        "heldout_by_cell": {
            f"{t}/{lv}": float(base.heldout_pass[(base.heldout.topic == t) & (base.heldout.level == lv)].mean())
            for t in np.unique(base.heldout.topic)
            for lv in np.unique(base.heldout.level)
        },
        "n_train": len(base.train),
        "n_heldout": len(base.heldout),
    }


def write_json(path: Path, data) -> None:
    """Write atomically (temp file + os.replace) so a crash never leaves half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
