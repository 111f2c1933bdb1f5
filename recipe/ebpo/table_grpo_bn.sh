#!/usr/bin/env bash
# GRPO with batch-std normalisation (paper: isolates the shrinkage): GRPO+BN = EBPO with S = 0, next to
# GRPO and EBPO, Qwen3-8B and Qwen3-14B, G=4, topic order. 6 runs, 4 of them shared with the main table.
#   bash recipe/ebpo/table_grpo_bn.sh [--list | hydra overrides for every run]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$HERE/common.sh"

declare -A SECTION=([qwen3_8b]=Qwen3-8B [qwen3_14b]=Qwen3-14B)
declare -A METHOD=([grpo]=GRPO [grpo_bn]=GRPO+BN [ebpo]=EBPO)
for model in qwen3_8b qwen3_14b; do
  for algo in grpo grpo_bn ebpo; do
    ebpo_experiment "${SECTION[$model]}" "${METHOD[$algo]}" "$model" "$model-$algo-g4-topic" \
      ALGO="$algo" GROUP_SIZE=4 ORDER=topic
  done
done
ebpo_drive grpo_bn "$@"
