"""End-to-end smoke run of verl's real trainer on CPU: train, checkpoint, crash, resume, and check the EB state.

``python -m ebpo_verl.smoke`` (``bash scripts/cpu_smoke.sh`` wraps it in an outer ``timeout``) builds a tiny Qwen3,
24 MATH-500 prompts (6 topics x 4) and 8 AMC23 prompts, and runs ``python -m ebpo_verl.main`` (``adv_estimator=ebpo``,
``rollout.n=4``, the topic curriculum) on the CPU backend (:mod:`.flows`):

* one node: run A trains steps 1-3; run K resumes A's step 2, refuses a second run on its folder, and is SIGKILLed
  after its step-3 checkpoint, before the step-3 log call; K' reruns K's command and resumes there; with ``--vllm``
  run C resumes A's step 2 with verl's vLLM rollout. ``--device cuda``: the same on a GPU.
* ``--nodes 2 [--faults]``: a two-node Ray cluster (:mod:`.cluster`), verl at world size 2 with vLLM; each fault
  (:mod:`.faults`) ends an attempt within its bound and the reruns resume; resumes from step-2 copies with a
  callable planted (:mod:`.planting`) are refused; then the evaluation of the last checkpoint (:mod:`.evaluation`).
* ``--hold [--stand-in]``: start, then wait to be stopped (the SIGTERM test).

:mod:`.settings` holds the data, model and verl overrides, :mod:`.runs` one training run, :mod:`.scan` the leak
scans, :mod:`.checks` and :mod:`.invariants` what the runs must show, :mod:`.limits` the nested time limits;
:mod:`.campaign` is the random-kill campaign, :mod:`.selfcheck` the GPU self-check.
"""
