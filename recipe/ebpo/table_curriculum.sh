#!/usr/bin/env bash
# Curriculum (paper Fig./Sec. "EBPO-diff"): Qwen3-8B-Base, prompts ordered easy -> hard by the base
# model's pass rate (16 rollouts at temperature 1.0, computed on the GPUs before the first run), one
# epoch (the authors' evaluated checkpoint, global step 34), no shuffle, final checkpoint evaluated;
# EBPO-diff vs GRPO-diff. The paper reports only the differences (AIME24 +3.95, AIME25 +6.04).
# 2 runs of 4 x 8 H200 plus the pass-rate pass.
#   bash recipe/ebpo/table_curriculum.sh [--help | --list | hydra overrides for every run]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$HERE/common.sh"
ebpo_paper_schedule epoch

BASE_MODEL=${BASE_MODEL:-Qwen/Qwen3-8B-Base}
for algo in ebpo grpo; do
  method=$([[ $algo == ebpo ]] && echo EBPO-diff || echo GRPO-diff)
  ebpo_experiment Qwen3-8B-Base "$method" qwen3_8b "qwen3_8b_base-$algo-g4-difficulty" \
    ALGO="$algo" GROUP_SIZE=4 ORDER=difficulty TOTAL_EPOCHS=1 MODEL_PATH="$BASE_MODEL"
done
ebpo_drive curriculum "$@"
