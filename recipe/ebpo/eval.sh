#!/usr/bin/env bash
# Pass@1 of a model on the five benchmarks (generation, then grading); --help lists the switches.
#   bash recipe/ebpo/eval.sh TARGET [extra generate args, e.g. --engine hf --limit 2 --max-new-tokens 64]
# Trust: a global_step_N TARGET is merged with its .pt shards read weights-only (anything but FSDP's tensor
# types is refused); --trust-checkpoint unpickles them as verl's merger does: it runs code from the file
# (docs/evaluation.md#trust).
exec "${PYTHON:-python3}" -m ebpo_verl.recipes eval "$@"
