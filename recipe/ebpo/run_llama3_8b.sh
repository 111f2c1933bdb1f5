#!/usr/bin/env bash
# EBPO / baselines on LLaMA-3.1-8B-Instruct (paper: 4 nodes x 8 H200). Settings and switches: common.sh.
#   bash recipe/ebpo/run_llama3_8b.sh                      # EBPO, G=4, topic order
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

MODEL_TAG=llama3_8b
MODEL_PATH=${MODEL_PATH:-meta-llama/Llama-3.1-8B-Instruct}
MODEL_OVERRIDES=(
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.7
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576
  actor_rollout_ref.actor.fsdp_config.param_offload=False
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
  actor_rollout_ref.ref.fsdp_config.param_offload=True
)

# shellcheck source=common.sh source-path=SCRIPTDIR
source "$HERE/common.sh"
ebpo_main "$@"
