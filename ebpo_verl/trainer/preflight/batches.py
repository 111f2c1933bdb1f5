"""Before Ray starts: the batch, mini-batch and micro-batch sizes divide over the run's ranks and rollout replicas.

verl 0.9.1's ``validate_config`` does not check each FSDP rank's share, so a bad micro-batch stops the run after
its first rollout (``data size must be divisible by force_group_size * micro_batch_size_per_gpu``). The shares, as
verl's v1 trainer forms them (``PPOTrainer._balance_batch`` / ``_get_required_batch_multiple``, ``train_mini_batch``):

* ranks ``D = nnodes x n_gpus_per_node / ulysses_sequence_parallel_size``; replicas ``R = nnodes x n_gpus_per_node /
  (tensor x data x pipeline parallel size)``, a whole number;
* mini-batch ``M = ppo_mini_batch_size x rollout.n``, divisible by ``D``;
* step batch ``B = train_batch_size x rollout.n`` padded to a multiple of ``lcm(D, M)``: log-prob share
  ``ceil(B / lcm(D, M)) x lcm(D, M) / D`` (rollout and ref ``log_prob_micro_batch_size_per_gpu``), update share
  ``M / D`` (``ppo_micro_batch_size_per_gpu``); each micro-batch size must divide its share. With
  ``*use_dynamic_bsz`` only ``M`` over ``D`` is checked. Megatron runs are left to verl's own checks.
"""

from __future__ import annotations

import math
from typing import Any

from ebpo_verl.ops.errors import EBPOConfigError

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"


def _divisor_at_most(total: int, limit: int) -> int:
    """The largest divisor of ``total`` that is at most ``limit`` (at least 1)."""
    return max(d for d in range(1, max(1, min(total, limit)) + 1) if total % d == 0)


def _mini_batch_that_divides(mini: int, n: int, ranks: int) -> int:
    """The nearest ``ppo_mini_batch_size`` (prompts) whose responses divide over ``ranks``, preferring a smaller one."""
    step = ranks // math.gcd(ranks, n)  # mini x n is a multiple of ranks iff mini is a multiple of this
    below, above = (mini // step) * step, -(-mini // step) * step
    return below if below >= 1 else above


def batch_division_problems(config: Any) -> list[str]:
    """Every batch-size setting of ``config`` that does not divide over its ranks and replicas, one message each
    (the key, the numbers, what verl would do, and a value that works). Empty when all divide."""
    strategy = str(config.actor_rollout_ref.actor.get("strategy", "fsdp"))
    if strategy == "megatron":
        return []
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    gpus = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    where = f"trainer.nnodes={config.trainer.nnodes} x trainer.n_gpus_per_node={config.trainer.n_gpus_per_node}"
    problems = []

    parallel = {
        key: int(rollout.get(key, 1) or 1)
        for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")
    }
    per_replica = math.prod(parallel.values())
    if gpus % per_replica:
        sizes = " x ".join(f"{ROLLOUT}.{k}={v}" for k, v in parallel.items())
        problems.append(
            f"{sizes} = {per_replica} GPUs per rollout replica does not divide the {gpus} GPUs ({where}): verl's "
            f"workers would stop at start-up; set {ROLLOUT}.tensor_model_parallel_size to a divisor of {gpus}, "
            f"e.g. {_divisor_at_most(gpus, parallel['tensor_model_parallel_size'])}"
        )

    sp = int(actor.get("ulysses_sequence_parallel_size", 1) or 1)
    if gpus % sp:
        problems.append(
            f"{ACTOR}.ulysses_sequence_parallel_size={sp} does not divide the {gpus} GPUs ({where}); "
            f"set it to a divisor of {gpus}, e.g. {_divisor_at_most(gpus, sp)}"
        )
        return problems
    ranks = gpus // sp
    n = int(rollout.n)
    mini, batch = int(actor.ppo_mini_batch_size), int(config.data.train_batch_size)
    mini_responses = mini * n
    if mini_responses % ranks:
        problems.append(
            f"{ACTOR}.ppo_mini_batch_size={mini} x {ROLLOUT}.n={n} = {mini_responses} responses per mini-batch do "
            f"not divide over the {ranks} data-parallel ranks ({where}, / ulysses {sp}): verl's update would stop "
            f"at its first step; set {ACTOR}.ppo_mini_batch_size={_mini_batch_that_divides(mini, n, ranks)}"
        )
        return problems

    multiple = math.lcm(ranks, mini_responses)
    log_prob_share = -(-batch * n // multiple) * multiple // ranks
    update_share = mini_responses // ranks
    checks = [
        (f"{ACTOR}.ppo_micro_batch_size_per_gpu", actor.get("ppo_micro_batch_size_per_gpu"),
         actor.get("use_dynamic_bsz", False), update_share,
         f"the {update_share} responses each rank gets per mini-batch ({ACTOR}.ppo_mini_batch_size={mini} x n={n} "
         f"/ {ranks} ranks)"),
        (f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", rollout.get("log_prob_micro_batch_size_per_gpu"),
         rollout.get("log_prob_use_dynamic_bsz", False), log_prob_share,
         f"the {log_prob_share} responses each rank gets per step (data.train_batch_size={batch} x n={n}, padded to "
         f"a multiple of {multiple}, / {ranks} ranks)"),
    ]  # fmt: skip
    from verl.trainer.ppo.utils import need_reference_policy

    if need_reference_policy(config):
        ref = config.actor_rollout_ref.ref
        checks.append((f"{REF}.log_prob_micro_batch_size_per_gpu", ref.get("log_prob_micro_batch_size_per_gpu"),
                       ref.get("log_prob_use_dynamic_bsz", False), log_prob_share, checks[1][4]))  # fmt: skip
    for key, micro, dynamic, share, what in checks:
        if dynamic or micro is None:
            continue
        if share % int(micro):
            problems.append(
                f"{key}={micro} does not divide {what} ({where}): verl would stop after the first rollout with "
                f"'data size must be divisible by force_group_size * micro_batch_size_per_gpu'; set "
                f"{key}={_divisor_at_most(share, int(micro))}"
            )
    return problems


def check_batch_division(config: Any, options: Any = None, dry_run: bool = False) -> None:
    """Raise :class:`~ebpo_verl.ops.errors.EBPOConfigError` with every problem of :func:`batch_division_problems`
    (a pre-flight check: ``options`` and ``dry_run`` are unused)."""
    problems = batch_division_problems(config)
    if problems:
        raise EBPOConfigError("; ".join(problems))
