"""For machines without a GPU: nothing of the GPU path imports this package.

- :mod:`.backend`: verl's ``cpu`` platform, an HF rollout server and the vLLM-CPU fixes, loaded into verl with
  ``VERL_USE_EXTERNAL_MODULES=ebpo_verl.cpu.backend VERL_PLATFORM=cpu`` (the CPU smoke runs, debugging a run on a
  laptop; docs/training.md, docs/vllm_cpu.md).
- :mod:`.tiny`: tiny Qwen3-shaped models and tokenizers built locally, for the smoke runs, the tests and the
  README's CPU evaluation example.
"""
