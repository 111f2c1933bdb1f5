#!/usr/bin/env bash
# Pass@1 of a model on MATH-500, AIME24, AIME25, AMC23 and OlympiadBench: generation on every GPU of this
# node (python -m ebpo_verl.evaluate generate), then grading on CPU (... grade).
#   bash recipe/ebpo/eval.sh TARGET [extra generate args, e.g. --engine hf --limit 2 --max-new-tokens 64]
# TARGET: a verl checkpoint (.../<experiment>/global_step_N, merged once to global_step_N/huggingface_merged),
# a checkpoint root (its latest step), a local Hugging Face folder or a hub id (Qwen/Qwen3-8B: untrained).
#   EVAL_PROTOCOL  paper (default: the authors' raw prompt + Answer: grader, 16 runs, OlympiadBench 4) |
#                  verl (chat template + ebpo_verl.reward, 16 runs) | both
#   EVAL_DIR       default WORK_DIR/eval/<name> (name: <experiment>-step<N>, or the model folder's name)
#   WORK_DIR       default ./ebpo_runs;  DATA_DIR  benchmark parquets, default WORK_DIR/data (prepared when
#                  missing; DATA_LOCAL_DIR: read the sources from files there instead of the hub)
#   PYTHON         default python3
# Writes EVAL_DIR/<protocol>/generations.jsonl and EVAL_DIR/results-<protocol>.json. Re-running resumes the
# generation (finished samples are kept) and re-grades.
set -euo pipefail

die() {
  echo "eval.sh: $*" >&2
  exit 2
}

if [[ $# -lt 1 || $1 == -* ]]; then
  die "usage: bash recipe/ebpo/eval.sh TARGET [extra generate args]"
fi
TARGET=${1%/}
shift
PYTHON=${PYTHON:-python3}
WORK_DIR=${WORK_DIR:-$PWD/ebpo_runs}
DATA_DIR=${DATA_DIR:-$WORK_DIR/data}
BENCHMARKS=(math500 aime2024 aime2025 amc23 olympiadbench)

case ${EVAL_PROTOCOL:-paper} in
  paper | verl) PROTOCOLS=("${EVAL_PROTOCOL:-paper}") ;;
  both) PROTOCOLS=(paper verl) ;;
  *) die "unknown EVAL_PROTOCOL=$EVAL_PROTOCOL (paper, verl or both)" ;;
esac

if [[ -f $TARGET/latest_checkpointed_iteration.txt ]]; then
  NAME=${TARGET##*/}-step$(<"$TARGET/latest_checkpointed_iteration.txt")
elif [[ ${TARGET##*/} == global_step_* ]]; then
  NAME=${TARGET%/*}
  NAME=${NAME##*/}-step${TARGET##*global_step_}
else
  NAME=${TARGET##*/}
fi
EVAL_DIR=${EVAL_DIR:-$WORK_DIR/eval/$NAME}

missing=()
for b in "${BENCHMARKS[@]}"; do [[ -f $DATA_DIR/$b.parquet ]] || missing+=("$b"); done
if ((${#missing[@]})); then
  echo "eval.sh: preparing ${missing[*]} in $DATA_DIR" >&2
  "$PYTHON" -m data_prep.all --out-dir "$DATA_DIR" --only "${missing[@]}" \
    ${DATA_LOCAL_DIR:+--local-dir "$DATA_LOCAL_DIR"} || die "data preparation failed"
fi

for protocol in "${PROTOCOLS[@]}"; do
  echo "eval.sh: $TARGET, protocol $protocol -> $EVAL_DIR" >&2
  "$PYTHON" -m ebpo_verl.evaluate generate --model "$TARGET" --data-dir "$DATA_DIR" --protocol "$protocol" \
    --out "$EVAL_DIR/$protocol/generations.jsonl" "$@"
  "$PYTHON" -m ebpo_verl.evaluate grade --protocol "$protocol" --generations "$EVAL_DIR/$protocol/generations.jsonl" \
    --data-dir "$DATA_DIR" --out "$EVAL_DIR/results-$protocol.json"
done
