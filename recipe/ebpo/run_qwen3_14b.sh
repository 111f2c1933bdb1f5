#!/usr/bin/env bash
# EBPO / baselines on Qwen3-14B (paper: 4 nodes x 8 H200); model settings: ebpo_verl/recipes/models/qwen3_14b.yaml.
#   bash recipe/ebpo/run_qwen3_14b.sh                       # EBPO, G=4, topic order
#   ALGO=grpo ORDER=naive bash recipe/ebpo/run_qwen3_14b.sh trainer.save_freq=5
#   bash recipe/ebpo/run_qwen3_14b.sh --help                # every switch
exec "${PYTHON:-python3}" -m ebpo_verl.recipes run qwen3_14b "$@"
