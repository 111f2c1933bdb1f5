"""ebpo_verl.trainer.preflight.batches: every rank's share of each batch, checked before Ray starts (issue 28).

The expected shares are computed by hand in each test from the numbers it sets (responses = prompts x n, padded
to a multiple of lcm(ranks, mini-batch responses), split over the ranks), not by the module's formula."""

from __future__ import annotations

import sys

import pytest

from ebpo_verl.main import compose
from ebpo_verl.ops.errors import EBPOConfigError
from ebpo_verl.trainer.preflight import preflight
from ebpo_verl.trainer.preflight.batches import batch_division_problems

A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"
NO_REF = [f"{A}.use_kl_loss=False", "algorithm.use_kl_in_reward=False"]


def _config(nodes: int, gpus: int, batch: int, n: int, mini: int, micro: int, log_prob_micro: int, *extra: str):
    return compose(
        [
            f"trainer.nnodes={nodes}",
            f"trainer.n_gpus_per_node={gpus}",
            f"data.train_batch_size={batch}",
            f"{R}.n={n}",
            f"{A}.ppo_mini_batch_size={mini}",
            f"{A}.ppo_micro_batch_size_per_gpu={micro}",
            f"{R}.log_prob_micro_batch_size_per_gpu={log_prob_micro}",
            f"{R}.tensor_model_parallel_size=1",
            *extra,
        ]
    )


def test_one_rank_sizes_on_two_nodes_are_refused_naming_keys_and_a_value_that_works():
    """The issue's probe: 4 prompts x 4 responses, micro-batches sized for one rank (16), run on two ranks."""
    config = _config(2, 1, 4, 4, 4, 16, 16, *NO_REF)
    with pytest.raises(EBPOConfigError) as err:
        preflight(config, dry_run=True)
    message = str(err.value)
    assert "\n" not in message
    # each rank gets 16 / 2 = 8 responses per step and per mini-batch: 16 does not divide 8, 8 does
    update, log_prob = f"{A}.ppo_micro_batch_size_per_gpu", f"{R}.log_prob_micro_batch_size_per_gpu"
    assert f"{update}=16 does not divide the 8 responses each rank gets per mini-batch" in message
    assert f"{log_prob}=16 does not divide the 8 responses each rank gets per step" in message
    assert f"set {update}=8" in message and f"set {log_prob}=8" in message
    assert "data size must be divisible by force_group_size * micro_batch_size_per_gpu" in message
    assert batch_division_problems(_config(2, 1, 4, 4, 4, 8, 8, *NO_REF)) == []
    assert batch_division_problems(_config(1, 1, 4, 4, 4, 16, 16, *NO_REF)) == []  # world size 1: fine


def test_the_padded_step_batch_and_the_mini_batch_share():
    # 6 prompts x 4 = 24 responses; mini 4 x 4 = 16; 2 ranks -> padded to a multiple of lcm(2, 16) = 16: 32,
    # 16 per rank for the log-probs; 16 / 2 = 8 per rank per mini-batch for the update
    problems = batch_division_problems(_config(1, 2, 6, 4, 4, 8, 12, *NO_REF))
    assert len(problems) == 1
    assert problems[0].startswith(f"{R}.log_prob_micro_batch_size_per_gpu=12 does not divide the 16")
    assert problems[0].endswith(f"set {R}.log_prob_micro_batch_size_per_gpu=8")
    assert batch_division_problems(_config(1, 2, 6, 4, 4, 8, 16, *NO_REF)) == []
    update = batch_division_problems(_config(1, 2, 6, 4, 4, 16, 16, *NO_REF))
    assert len(update) == 1 and f"{A}.ppo_micro_batch_size_per_gpu=16 does not divide the 8 responses" in update[0]


def test_a_mini_batch_that_does_not_split_over_the_ranks():
    # 1 prompt x 3 responses per mini-batch over 2 ranks; 2 prompts x 3 = 6 do split
    problems = batch_division_problems(_config(1, 2, 4, 3, 1, 1, 1, *NO_REF))
    assert len(problems) == 1 and problems[0].startswith(f"{A}.ppo_mini_batch_size=1 x {R}.n=3 = 3 responses")
    assert problems[0].endswith(f"set {A}.ppo_mini_batch_size=2")
    assert batch_division_problems(_config(1, 2, 4, 3, 2, 3, 6, *NO_REF)) == []
    # with Ulysses sequence parallelism 2 on 4 GPUs the data-parallel ranks are 2, not 4
    sp = f"{A}.ulysses_sequence_parallel_size=2"
    assert batch_division_problems(_config(1, 4, 4, 3, 2, 3, 6, *NO_REF, sp)) == []


def test_the_reference_policy_and_dynamic_batch_sizes():
    ref = "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"
    kl = [f"{A}.use_kl_loss=True", f"{ref}=16"]
    problems = batch_division_problems(_config(2, 1, 4, 4, 4, 8, 8, *kl))
    assert len(problems) == 1 and problems[0].startswith(f"{ref}=16 does not divide the 8 responses")
    dynamic = [f"{A}.use_dynamic_bsz=True", f"{R}.log_prob_use_dynamic_bsz=True", *NO_REF]
    assert batch_division_problems(_config(2, 1, 4, 4, 4, 16, 16, *dynamic)) == []  # no fixed micro-batch


def test_rollout_parallel_size_must_divide_the_gpus():
    problems = batch_division_problems(_config(1, 4, 4, 4, 4, 4, 4, *NO_REF, f"{R}.tensor_model_parallel_size=3"))
    assert len(problems) == 1 and "= 3 GPUs per rollout replica does not divide the 4 GPUs" in problems[0]
    assert problems[0].endswith("e.g. 2")


def test_the_papers_32_gpus():
    """4 nodes x 8 GPUs, 512 prompts x 8, mini 128 x 8 = 1024 -> 32 responses per rank per mini-batch, 128 per
    step: a micro-batch of 48 is refused (32 works), 32 ranks with dynamic sizes (the recipes) pass."""
    config = _config(4, 8, 512, 8, 128, 48, 64, *NO_REF)
    (problem,) = batch_division_problems(config)
    assert problem.startswith(f"{A}.ppo_micro_batch_size_per_gpu=48 does not divide the 32 responses each rank")
    assert problem.endswith(f"set {A}.ppo_micro_batch_size_per_gpu=32")
    assert batch_division_problems(_config(4, 8, 512, 8, 128, 32, 64, *NO_REF)) == []


def test_the_entry_point_refuses_in_one_line(monkeypatch, capsys):
    from ebpo_verl import main as entry

    args = ["trainer.nnodes=2", "trainer.n_gpus_per_node=1", "data.train_batch_size=4", f"{A}.ppo_mini_batch_size=4",
            f"{A}.ppo_micro_batch_size_per_gpu=16", f"{R}.tensor_model_parallel_size=1", *NO_REF,
            "--cfg", "job"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["ebpo-train", *args])
    with pytest.raises(SystemExit) as exit_:
        entry.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("ebpo-train: error:")]
    assert f"{A}.ppo_micro_batch_size_per_gpu=16 does not divide the 8 responses" in line
