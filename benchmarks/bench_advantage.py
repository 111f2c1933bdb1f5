"""Time ``ebpo`` (history statistics + 10 clusters) against verl's ``grpo`` and ``grpo_vectorized``.

All estimators run in this process on the same inputs, round-robin (one call of each per round, so a busy machine
slows them alike); prints the median time of each per shape and the ratios. Shapes (prompts x responses x
tokens): 512x16x4096 and the paper's 512x4x8192 (docs/paper_notes.md#setup: batch 512 prompts, G=4, max response 8192).
Target: ebpo <= 1.0x grpo_vectorized at every shape. Every other estimator of the registry (:data:`BASELINES`:
``shrinkage_js``, ``bnpo``, ``spo``, ``dbb``, and any added one; stable prompt keys, trackers warm after the
warm-up call) runs in the same rounds, with its ratio to grpo_vectorized. Ours run as ``ebpo-train`` runs them: one
object per estimator (``registry.new_estimator``) through ``ebpo_verl.trainer.adapter.outcome_advantages``.

    python benchmarks/bench_advantage.py [--device cpu|cuda] [--threads N] [--shapes 512x16x4096,512x4x8192]
        [--repeats 11]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import numpy as np
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from ebpo_verl.algos import registry
from ebpo_verl.options.cli import parse
from ebpo_verl.options.parsing import OptionSection, ints, option, text
from ebpo_verl.trainer.adapter import outcome_advantages

DEFAULT_SHAPES = "512x16x4096,512x4x8192"
TARGET = 1.0
BASELINES = tuple(name for name in registry.ours() if name != "ebpo")
"""Every estimator of ours but ``ebpo``, in the registry's order."""


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"512x16x4096,512x4x8192"`` -> [(512, 16, 4096), (512, 4, 8192)]."""
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"--shapes: {item!r} is not PROMPTSxGROUPxTOKENS with positive integers")
        shapes.append(tuple(int(p) for p in parts))
    return shapes


def make_inputs(prompts: int, group: int, tokens: int, device: str, seed: int = 0):
    """Outcome rewards on the last response token (random lengths), uids and 10 topic labels as verl passes them."""
    gen = torch.Generator().manual_seed(seed)
    bs = prompts * group
    lengths = torch.randint(1, tokens + 1, (bs,), generator=gen)
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(bs, tokens)
    rewards[torch.arange(bs), lengths - 1] = torch.randint(0, 2, (bs,), generator=gen).float()
    uids = np.repeat(np.array([f"uid-{i}" for i in range(prompts)], dtype=object), group)
    labels = np.repeat(np.array([f"topic-{i % 10}" for i in range(prompts)], dtype=object), group)
    return rewards.to(device), mask.to(device), uids, labels


def round_robin_medians(fns: dict[str, Callable[[], object]], repeats: int, sync: Callable[[], None]) -> dict:
    """Median seconds of each function, called once per round in turn after one warm-up call each."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    sync()
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def ours(name: str, overrides: dict, rewards, mask, uids, fields: dict) -> Callable[[], object]:
    """One call of a fresh estimator of ours (options: defaults + ``overrides``) on the inputs, with the per-row
    field its options name (``fields``: ``topic`` labels, ``index`` prompt keys)."""
    estimate = registry.new_estimator(name, overrides)
    source = estimate.spec.row_source(estimate.options)
    values = None if source is None else fields["sample_index" if source.sample_index else source.field]
    return lambda: outcome_advantages(estimate, rewards, mask, uids, values)


def bench_shape(prompts: int, group: int, tokens: int, device: str, repeats: int) -> dict[str, float]:
    rewards, mask, uids, labels = make_inputs(prompts, group, tokens, device)
    fields = {"topic": labels, "index": np.repeat(np.arange(prompts), group)}  # extra_info fields per row
    fields["sample_index"] = np.tile(np.arange(group), prompts).astype(object)  # the rollout's order in a group
    fns = {"ebpo": ours("ebpo", {"cluster_key": "topic"}, rewards, mask, uids, fields)}
    fns.update({name: partial(get_adv_estimator_fn(name), rewards, mask, uids) for name in ("grpo", "grpo_vectorized")})
    fns.update({name: ours(name, {}, rewards, mask, uids, fields) for name in BASELINES})
    return round_robin_medians(fns, repeats, torch.cuda.synchronize if device == "cuda" else (lambda: None))


@dataclass(frozen=True)
class BenchOptions(OptionSection):
    """The benchmark's options, declared once."""

    SECTION: ClassVar[str] = "bench_advantage"

    device: str = option("cpu", "where the estimators run", choices=("cpu", "cuda"))
    threads: int | None = option(None, "torch intra-op threads; null: torch's", choices=(None,), rule=ints(1))
    shapes: str = option(DEFAULT_SHAPES, "comma-separated PxGxL", rule=text("shapes"))
    repeats: int = option(11, "round-robin runs per shape (the median is reported)", rule=ints(1))


def main(argv: list[str] | None = None) -> int:
    options = parse(BenchOptions, None, argv, __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    try:
        shapes = parse_shapes(options.shapes)
        if options.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is visible to torch")
    except ValueError as err:
        print(f"bench_advantage: error: {err}", file=sys.stderr)
        return 2
    if options.threads is not None:
        torch.set_num_threads(options.threads)

    threads = torch.get_num_threads()
    print(f"device={options.device} torch threads={threads} median of {options.repeats} round-robin runs")
    worst = 0.0
    for prompts, group, tokens in shapes:
        timings = bench_shape(prompts, group, tokens, options.device, options.repeats)
        ratio = timings["ebpo"] / timings["grpo_vectorized"]
        worst = max(worst, ratio)
        cells = "  ".join(f"{name} {seconds * 1e3:8.2f} ms" for name, seconds in timings.items())
        print(
            f"{prompts}x{group}x{tokens}: {cells}  ebpo/grpo = {timings['ebpo'] / timings['grpo']:.3f}  "
            f"ebpo/grpo_vectorized = {ratio:.3f}  "
            + "  ".join(f"{n}/grpo_vectorized = {timings[n] / timings['grpo_vectorized']:.3f}" for n in BASELINES)
        )
    print(f"worst ebpo/grpo_vectorized = {worst:.3f} (target <= {TARGET})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
