#!/usr/bin/env bash
# Group-size table (paper Table 2): Qwen3-8B, G = 8, 16, 32 x EBPO, GRPO, DAPO; topic order.
# 9 runs of 4 x 8 H200 each (G=32 generates 16,384 responses per step).
#   bash recipe/ebpo/table_group_size.sh [--list | hydra overrides for every run]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$HERE/common.sh"

declare -A METHOD=([ebpo]=EBPO [grpo]=GRPO [dapo]=DAPO)
for g in 8 16 32; do
  for algo in ebpo grpo dapo; do
    ebpo_experiment "G=$g" "${METHOD[$algo]}" qwen3_8b "qwen3_8b-$algo-g$g-topic" \
      ALGO="$algo" GROUP_SIZE="$g" ORDER=topic
  done
done
ebpo_drive group_size "$@"
