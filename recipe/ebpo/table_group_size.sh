#!/usr/bin/env bash
# Group-size table (paper Table 2): Qwen3-8B, G = 8, 16, 32 x EBPO, GRPO, DAPO. EBPO: topic order;
# GRPO / DAPO: shuffled (BASELINES=paper) or topic order (canonical). Runs stop at step 200 (TOTAL_STEPS).
# 9 runs of 4 x 8 H200 each (G=32 generates 16,384 responses per step).
#   bash recipe/ebpo/table_group_size.sh [--help | --list | hydra overrides for every run]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$HERE/common.sh"
ebpo_paper_schedule 200

declare -A METHOD=([ebpo]=EBPO [grpo]=GRPO [dapo]=DAPO)
for g in 8 16 32; do
  for algo in ebpo grpo dapo; do
    order=$(ebpo_row_order "$algo")
    ebpo_experiment "G=$g" "${METHOD[$algo]}" qwen3_8b "qwen3_8b-$algo-g$g-$order" \
      ALGO="$algo" GROUP_SIZE="$g" ORDER="$order"
  done
done
ebpo_drive group_size "$@"
