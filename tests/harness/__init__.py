"""The proof harness: end-to-end runs of verl's real trainer on CPU (train, checkpoint, crash, resume, check the EB
state), the two-node cluster run with its faults, and the random-kill campaign. It runs from a checkout, not from
the wheel: ``python -m tests.harness`` from the repository root (``bash scripts/cpu_smoke.sh`` wraps it in an outer
``timeout``), ``python -m tests.harness.campaign``. ``tests`` is a package so that it, not verl's own top-level
``tests``, is imported wherever the checkout is first on the path (the campaign's runs put it on ``PYTHONPATH``).

``python -m tests.harness`` builds a tiny Qwen3, 24 MATH-500 prompts (6 topics x 4) and 8 AMC23 prompts, and runs
``python -m ebpo_verl.main`` (``adv_estimator=ebpo``, ``rollout.n=4``, the topic curriculum) on the CPU backend
(:mod:`.flows`):

* one node: run A trains steps 1-3; run K resumes A's step 2, refuses a second run on its folder, and is SIGKILLed
  after its step-3 checkpoint, before the step-3 log call; K' reruns K's command and resumes there; with ``--vllm``
  run C resumes A's step 2 with verl's vLLM rollout. ``--device cuda``: the same on a GPU.
* ``--nodes 2 [--faults]``: a two-node Ray cluster (:mod:`tests.harness.cluster`), verl at world size 2 with
  vLLM; each fault (:mod:`tests.harness.faults`) ends an attempt within its bound and the reruns resume; resumes
  from step-2 copies with a callable planted (:mod:`tests.harness.planting`) are refused; then the evaluation of
  the last checkpoint (:mod:`tests.harness.evaluation`).
* ``--hold [--stand-in]``: start, then wait to be stopped (the SIGTERM test).

:mod:`.campaign` is the random-kill campaign. Beside them: the runs' data and overrides (:mod:`.settings`),
starting and killing a run (:mod:`.runs`), the leak scans (:mod:`.scan`), the time limits (:mod:`.limits`), what
the runs must show (:mod:`.checks`, :mod:`.invariants`). The GPU self-check (``python -m ebpo_verl.smoke.selfcheck``)
is the wheel's, with a train check of its own (``ebpo_verl/smoke/train_check.py``).
"""
