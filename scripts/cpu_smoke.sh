#!/usr/bin/env bash
# End-to-end CPU smoke run of verl's trainer with EBPO: run A trains 3 steps (checkpoint at 2); run K resumes A's
# step 2, refuses a second run on its folder, redoes step 3 exactly as A did and is killed after its step-3
# checkpoint; its rerun K' resumes step 3, logs it once and trains step 4; then checks metrics, EB state,
# validation and curriculum order (see scripts/cpu_smoke.py); --vllm also resumes A's step 2 with verl's vLLM
# rollout (vLLM's CPU build), steps 3-4.
# Usage: bash scripts/cpu_smoke.sh [--work-dir DIR] [--run-timeout SECONDS] [--vllm]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
exec timeout --kill-after=30 "${CPU_SMOKE_TIMEOUT:-1800}" "$PYTHON" scripts/cpu_smoke.py "$@"
