#!/usr/bin/env bash
# Ordering ablation (paper Table 3): EBPO with topic-clustered batches vs the native order (EBPO-naive),
# Qwen3-8B and Qwen3-14B, G=4. Topic labels: embedding clusters (all-MiniLM-L6-v2, UMAP, k-means K=10,
# seed 42: the paper's BERTopic row). The paper's main EBPO row used GPT-4.1 labels: give a parquet with
# those labels in extra_info.topic as GPT_TOPIC_FILE to add that row. 4 runs (6 with GPT_TOPIC_FILE);
# the embedding-topic runs are the main table's EBPO runs (shared, run once).
# Runs stop at step 200 (TOTAL_STEPS).
#   bash recipe/ebpo/table_ordering.sh [--help | --list | hydra overrides for every run]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$HERE/common.sh"
ebpo_paper_schedule 200

declare -A SECTION=([qwen3_8b]=Qwen3-8B [qwen3_14b]=Qwen3-14B)
for model in qwen3_8b qwen3_14b; do
  if [[ -n ${GPT_TOPIC_FILE:-} ]]; then
    ebpo_experiment "${SECTION[$model]}" "EBPO-topic (GPT-4.1 labels)" "$model" "$model-ebpo-g4-topic_gpt" \
      ALGO=ebpo GROUP_SIZE=4 ORDER=topic TOPICS=file TRAIN_FILE="$GPT_TOPIC_FILE"
  fi
  ebpo_experiment "${SECTION[$model]}" "EBPO-topic (embedding labels)" "$model" "$model-ebpo-g4-topic" \
    ALGO=ebpo GROUP_SIZE=4 ORDER=topic
  ebpo_experiment "${SECTION[$model]}" EBPO-naive "$model" "$model-ebpo-g4-naive" ALGO=ebpo GROUP_SIZE=4 \
    ORDER=naive
done
ebpo_drive ordering "$@"
