#!/usr/bin/env bash
# EBPO / baselines on Qwen3-14B (paper: 4 nodes x 8 H200). Settings and switches: common.sh.
#   bash recipe/ebpo/run_qwen3_14b.sh                      # EBPO, G=4, topic order
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

MODEL_TAG=qwen3_14b
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-14B}
# rollout engines over 2 GPUs; optimizer state offloaded to CPU; one 12k-token sequence per GPU at a time
MODEL_OVERRIDES=(
  actor_rollout_ref.rollout.tensor_model_parallel_size=2
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384
  actor_rollout_ref.actor.fsdp_config.param_offload=False
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=True
  actor_rollout_ref.ref.fsdp_config.param_offload=True
)

# shellcheck source=common.sh source-path=SCRIPTDIR
source "$HERE/common.sh"
ebpo_main "$@"
