"""Time ``ebpo`` (history statistics + 10 clusters) against verl's ``grpo`` and ``grpo_vectorized``.

512 prompts x 16 responses x 4096 tokens, all three in this process on the same inputs; prints the median
time of each and the ratios. Targets: ebpo <= 0.5x grpo and <= 1.5x grpo_vectorized. The v2 draft's baselines
``shrinkage_js``, ``bnpo`` and ``spo`` (stable prompt keys, tracker warm after the first call) are timed too, with
their ratio to grpo_vectorized.

    python benchmarks/bench_advantage.py [--prompts 512] [--group 16] [--tokens 4096] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

import ebpo_verl
from ebpo_verl.baselines import SPO_STATE

BASELINES = ("shrinkage_js", "bnpo", "spo")


def make_inputs(prompts: int, group: int, tokens: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    bs = prompts * group
    lengths = torch.randint(1, tokens + 1, (bs,), generator=gen)
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(bs, tokens)
    rewards[torch.arange(bs), lengths - 1] = torch.randint(0, 2, (bs,), generator=gen).float()
    uids = np.repeat(np.array([f"uid-{i}" for i in range(prompts)], dtype=object), group)
    labels = np.repeat(np.array([f"topic-{i % 10}" for i in range(prompts)], dtype=object), group)
    return rewards, mask, uids, labels


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    rewards, mask, uids, labels = make_inputs(args.prompts, args.group, args.tokens)
    ebpo = get_adv_estimator_fn("ebpo")
    grpo = get_adv_estimator_fn("grpo")
    grpo_vec = get_adv_estimator_fn("grpo_vectorized")
    config = OmegaConf.create({"ebpo": {"cluster_key": "topic"}})
    ebpo_verl.get_state().reset()
    SPO_STATE.reset()
    prompt_keys = np.repeat(np.arange(args.prompts), args.group)  # SPO's stable keys (extra_info["index"])
    baselines = {name: get_adv_estimator_fn(name) for name in BASELINES}

    timings = {
        "ebpo": median_seconds(
            lambda: ebpo(token_level_rewards=rewards, response_mask=mask, index=uids, config=config, labels=labels),
            args.repeats,
        ),
        "grpo": median_seconds(lambda: grpo(rewards, mask, uids), args.repeats),
        "grpo_vectorized": median_seconds(lambda: grpo_vec(rewards, mask, uids), args.repeats),
    }
    extra = {"spo": {"prompt_keys": prompt_keys}}
    for name, fn in baselines.items():
        kwargs = extra.get(name, {})
        timings[name] = median_seconds(lambda fn=fn, kw=kwargs: fn(rewards, mask, uids, config, **kw), args.repeats)
    shape = f"{args.prompts} prompts x {args.group} responses x {args.tokens} tokens"
    print(f"median of {args.repeats} runs, {shape}, torch threads={torch.get_num_threads()}")
    for name, seconds in timings.items():
        print(f"  {name:16s} {seconds * 1e3:9.1f} ms")
    print(
        f"ebpo/grpo = {timings['ebpo'] / timings['grpo']:.3f} (target <= 0.5)   "
        f"ebpo/grpo_vectorized = {timings['ebpo'] / timings['grpo_vectorized']:.3f} (target <= 1.5)"
    )
    print("   ".join(f"{n}/grpo_vectorized = {timings[n] / timings['grpo_vectorized']:.3f}" for n in BASELINES))


if __name__ == "__main__":
    main()
