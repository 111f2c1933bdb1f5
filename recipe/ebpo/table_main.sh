#!/usr/bin/env bash
# Main table (paper Table 1): Qwen3-8B, Qwen3-14B, LLaMA-3.1-8B-Instruct x GRPO, Dr.GRPO, DAPO,
# EntropyMech, EBPO; G=4. EBPO: topic order; baselines: shuffled (BASELINES=paper, as the authors ran them)
# or topic order (BASELINES=canonical). Each run stops at global step 200, the authors' evaluated checkpoint
# (TOTAL_STEPS), validating on AIME24 x 8 every 5 steps; its last checkpoint is then evaluated (eval.sh).
# V2_ROWS=1 adds the v2 draft's rows (Qwen3-8B: REINFORCE++, RLOO, SPO, EBPO-BB, and the fork's BNPO and
# James-Stein (JS) baselines; Qwen3-14B: EBPO-BB). 15 runs (22 with V2_ROWS) of 4 x 8 H200 each.
#   bash recipe/ebpo/table_main.sh [--help | --list | hydra overrides for every run]
#   REWARD=math_verify BASELINES=canonical TOTAL_STEPS=100 bash recipe/ebpo/table_main.sh
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$HERE/common.sh"
ebpo_paper_schedule 200

declare -A SECTION=([qwen3_8b]=Qwen3-8B [qwen3_14b]=Qwen3-14B [llama3_8b]=LLaMA3.1-8B)
declare -A METHOD=([grpo]=GRPO [drgrpo]=Dr.GRPO [dapo]=DAPO [entropy_mech]=EntropyMech [ebpo]=EBPO
  [reinforce_pp]=REINFORCE++ [rloo]=RLOO [spo]=SPO [bnpo]=BNPO [js]=JS [ebpo_bb]=EBPO-BB)
for model in qwen3_8b qwen3_14b llama3_8b; do
  algos=(grpo drgrpo dapo entropy_mech ebpo)
  if [[ ${V2_ROWS:-0} == 1 && $model == qwen3_8b ]]; then algos+=(reinforce_pp rloo spo bnpo js ebpo_bb); fi
  if [[ ${V2_ROWS:-0} == 1 && $model == qwen3_14b ]]; then algos+=(ebpo_bb); fi
  for algo in "${algos[@]}"; do
    order=$(ebpo_row_order "$algo")
    ebpo_experiment "${SECTION[$model]}" "${METHOD[$algo]}" "$model" "$model-$algo-g4-$order" \
      ALGO="$algo" GROUP_SIZE=4 ORDER="$order"
  done
done
ebpo_drive main "$@"
