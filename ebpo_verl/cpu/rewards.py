"""The smoke runs' and the step-cost benchmark's rewards (verl loads this file by path:
``reward.custom_reward_function.path``, without registering it as a module: so nothing here may need that)."""

from __future__ import annotations

import hashlib
import zlib


def coin_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """Smoke-run reward: the low bit of sha256(response), so a random model gets mixed groups (math-verify: all 0)."""
    passed = hashlib.sha256(solution_str.encode("utf-8")).digest()[0] % 2 == 1
    return {"score": float(passed), "acc": passed}


def parity_reward(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """The step-cost benchmark's reward: the parity of the response's CRC-32."""
    return float(zlib.crc32(solution_str.encode("utf-8")) & 1)
