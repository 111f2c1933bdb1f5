"""For machines without a GPU (nothing of the GPU path imports this package): :mod:`.backend`, verl's ``cpu``
platform, HF rollout and vLLM-CPU fixes (the CPU smoke runs, debugging on a laptop; docs/training.md,
docs/vllm_cpu.md); :mod:`.tiny`, tiny models built locally (smoke runs, tests, the README's CPU evaluation).
"""
