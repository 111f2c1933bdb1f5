#!/usr/bin/env bash
# GRPO with batch-std normalisation (paper: isolates the shrinkage): GRPO+BN = EBPO with S = 0, next to
# GRPO and EBPO, Qwen3-8B and Qwen3-14B, G=4; GRPO+BN and EBPO in topic order, GRPO as in the main table.
# Runs stop at step 200 (TOTAL_STEPS). 6 runs, 4 of them shared with the main table.
#   bash recipe/ebpo/table_grpo_bn.sh [--help | --list | hydra overrides for every run]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$HERE/common.sh"
ebpo_paper_schedule 200

declare -A SECTION=([qwen3_8b]=Qwen3-8B [qwen3_14b]=Qwen3-14B)
declare -A METHOD=([grpo]=GRPO [grpo_bn]=GRPO+BN [ebpo]=EBPO)
for model in qwen3_8b qwen3_14b; do
  for algo in grpo grpo_bn ebpo; do
    order=$(ebpo_row_order "$algo")
    ebpo_experiment "${SECTION[$model]}" "${METHOD[$algo]}" "$model" "$model-$algo-g4-$order" \
      ALGO="$algo" GROUP_SIZE=4 ORDER="$order"
  done
done
ebpo_drive grpo_bn "$@"
