"""The smoke runs' reward (verl loads this file by path: ``reward.custom_reward_function.path``)."""

from __future__ import annotations

import hashlib


def coin_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """Smoke-run reward: the low bit of sha256(response) -- deterministic, about half the responses pass.

    A random 50k-parameter model never solves a MATH problem, so math-verify would give all-zero groups and
    degenerate (trivially equal) EB statistics; this pseudo-reward gives mixed groups."""
    passed = hashlib.sha256(solution_str.encode("utf-8")).digest()[0] % 2 == 1
    return {"score": float(passed), "acc": passed}
