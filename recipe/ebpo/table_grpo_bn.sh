#!/usr/bin/env bash
# The paper's grpo_bn table (rows, schedule and cost: ebpo_verl/recipes/tables.py, or --help).
#   bash recipe/ebpo/table_grpo_bn.sh [--help | --list | hydra overrides for every run]
exec "${PYTHON:-python3}" -m ebpo_verl.recipes table grpo_bn "$@"
