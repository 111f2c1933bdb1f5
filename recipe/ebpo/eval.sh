#!/usr/bin/env bash
# Pass@1 of a model on the five benchmarks (generation, then grading); --help lists the switches.
#   bash recipe/ebpo/eval.sh TARGET [extra generate args, e.g. --engine hf --limit 2 --max-new-tokens 64]
exec "${PYTHON:-python3}" -m ebpo_verl.recipes eval "$@"
