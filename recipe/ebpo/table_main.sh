#!/usr/bin/env bash
# Main table (paper Table 1): Qwen3-8B, Qwen3-14B, LLaMA-3.1-8B-Instruct x GRPO, Dr.GRPO, DAPO,
# EntropyMech, EBPO; G=4, topic order. V2_ROWS=1 adds the v2 draft's rows (Qwen3-8B: REINFORCE++, RLOO,
# EBPO-BB; Qwen3-14B: EBPO-BB). 15 runs (19 with V2_ROWS) of 4 x 8 H200 each.
#   bash recipe/ebpo/table_main.sh [--list | hydra overrides for every run]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$HERE/common.sh"

declare -A SECTION=([qwen3_8b]=Qwen3-8B [qwen3_14b]=Qwen3-14B [llama3_8b]=LLaMA3.1-8B)
declare -A METHOD=([grpo]=GRPO [drgrpo]=Dr.GRPO [dapo]=DAPO [entropy_mech]=EntropyMech [ebpo]=EBPO
  [reinforce_pp]=REINFORCE++ [rloo]=RLOO [ebpo_bb]=EBPO-BB)
for model in qwen3_8b qwen3_14b llama3_8b; do
  algos=(grpo drgrpo dapo entropy_mech ebpo)
  if [[ ${V2_ROWS:-0} == 1 && $model == qwen3_8b ]]; then algos+=(reinforce_pp rloo ebpo_bb); fi
  if [[ ${V2_ROWS:-0} == 1 && $model == qwen3_14b ]]; then algos+=(ebpo_bb); fi
  for algo in "${algos[@]}"; do
    ebpo_experiment "${SECTION[$model]}" "${METHOD[$algo]}" "$model" "$model-$algo-g4-topic" \
      ALGO="$algo" GROUP_SIZE=4 ORDER=topic
  done
done
ebpo_drive main "$@"
