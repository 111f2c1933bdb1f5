#!/usr/bin/env bash
# Pass@1 of a checkpoint on MATH-500, AIME24, AIME25, AMC23 and OlympiadBench, as the paper evaluates:
# temperature 1.0, top-p 1.0, 20,480 new tokens, 16 samples per problem (Pass@1 = val-core/<set>/acc/mean@16).
#   bash recipe/ebpo/eval.sh CKPT [hydra overrides...]
# CKPT: a verl checkpoint (.../<experiment>/global_step_N), a checkpoint root (its latest step) or a
# Hugging Face model directory. MODEL (qwen3_8b | qwen3_14b | llama3_8b) picks the model script and so
# the base model and memory settings; by default it is read from the experiment name's prefix.
# Metrics: LOG_DIR/eval-<experiment>-step<N>/metrics.jsonl (read by scripts/make_tables.py).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [[ $# -lt 1 || $1 == -* ]]; then
  echo "usage: $0 CKPT [hydra overrides...]" >&2
  exit 2
fi
CKPT=$1
shift
if [[ -z ${MODEL:-} ]]; then
  for tag in qwen3_8b qwen3_14b llama3_8b; do
    [[ $CKPT == *"/$tag-"* ]] && MODEL=$tag
  done
fi
if [[ -z ${MODEL:-} || ! -f $HERE/run_$MODEL.sh ]]; then
  echo "eval.sh: set MODEL to qwen3_8b, qwen3_14b or llama3_8b (cannot tell from $CKPT)" >&2
  exit 2
fi
VAL_N=${VAL_N:-16} EVAL_CKPT=$CKPT exec bash "$HERE/run_$MODEL.sh" "$@"
