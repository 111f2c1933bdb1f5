#!/usr/bin/env bash
# End-to-end CPU smoke run of verl's trainer with EBPO: train 3 steps (checkpoint at 2), resume from step 2,
# redo step 3, and check metrics, EB state, validation and curriculum order (see scripts/cpu_smoke.py); --vllm
# also resumes step 2 with verl's vLLM rollout (vLLM's CPU build) and trains steps 3-4.
# Usage: bash scripts/cpu_smoke.sh [--work-dir DIR] [--run-timeout SECONDS] [--vllm]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
exec timeout --kill-after=30 "${CPU_SMOKE_TIMEOUT:-1800}" "$PYTHON" scripts/cpu_smoke.py "$@"
