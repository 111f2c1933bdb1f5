#!/usr/bin/env bash
# The rivals table (rows, schedule and cost: ebpo_verl/recipes/tables.py, or --help).
#   bash recipe/ebpo/table_rivals.sh [--help | --list | hydra overrides for every run]
exec "${PYTHON:-python3}" -m ebpo_verl.recipes table rivals "$@"
