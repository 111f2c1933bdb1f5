#!/usr/bin/env bash
# End-to-end CPU smoke run of verl's trainer with EBPO (python -m tests.harness from the checkout's root: the harness
# is tests/harness/, not in the wheel; see its package docstring and docs/training.md): runs A, K (killed) and K' on
# one node, --vllm also run C; --nodes 2 [--faults] the two-node cluster run with its faults and evaluation; --hold
# the SIGTERM test's subject.
# Time limits, nested (tests/harness/limits.py): this `timeout` (CPU_SMOKE_TIMEOUT, default 1500 s) is the
# outer one; the script gets --deadline = CPU_SMOKE_TIMEOUT - 120 s (its cleanup margin) and on the SIGTERM of
# `timeout` stops its cluster and runs; SIGKILL follows 90 s later (--kill-after).
# Usage: bash scripts/cpu_smoke.sh [--work-dir DIR] [--run-timeout SECONDS] [--vllm] [--nodes 2 [--faults]]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUTER=${CPU_SMOKE_TIMEOUT:-1500}
CLEANUP_MARGIN=120  # tests.harness.limits.CLEANUP_MARGIN_S
exec timeout --kill-after=90 "$OUTER" "$PYTHON" -m tests.harness --deadline "$((OUTER - CLEANUP_MARGIN))" "$@"
