#!/usr/bin/env bash
# EBPO / baselines on LLaMA-3.1-8B-Instruct (paper: 4 nodes x 8 H200); model settings: ebpo_verl/recipes/models/llama3_8b.yaml.
#   bash recipe/ebpo/run_llama3_8b.sh                       # EBPO, G=4, topic order
#   ALGO=grpo ORDER=naive bash recipe/ebpo/run_llama3_8b.sh trainer.save_freq=5
#   bash recipe/ebpo/run_llama3_8b.sh --help                # every switch
exec "${PYTHON:-python3}" -m ebpo_verl.recipes run llama3_8b "$@"
