"""End-to-end smoke run of verl's real trainer on CPU: train, checkpoint, crash, resume, and check the EB state.

``python -m ebpo_verl.smoke`` (``bash scripts/cpu_smoke.sh`` wraps it in an outer ``timeout``). Builds a tiny
Qwen3 and tokenizer, prepares 24 MATH-500 prompts (6 topics x 4) and 8 AMC23 prompts, then runs
``python -m ebpo_verl.main`` (``adv_estimator=ebpo``, ``rollout.n=4``, the topic curriculum) on the CPU backend:

* one node: run A trains steps 1-3; run K resumes A's step 2, refuses a second run on its folder, and is
  SIGKILLed after its step-3 checkpoint, before the step-3 log call; K' reruns K's command and resumes there;
  with ``--vllm`` run C resumes A's step 2 with verl's vLLM rollout. ``--device cuda``: the same on a GPU.
* ``--nodes 2 [--faults]``: a two-node Ray cluster, verl at world size 2 with vLLM; the faults (SIGKILL of a
  rank, SIGSTOP of it, SIGKILL of a rollout server) each end an attempt within their bound; the reruns resume;
  resumes from copies of the step-2 checkpoint with a callable planted (rank 1's model shard, ``data.pt``) are
  refused; then the evaluation of the last checkpoint.
* ``--hold [--stand-in]``: start, then wait to be stopped (the SIGTERM test).

Modules, importable by tests and by the random-kill campaign:

* :mod:`.settings` -- data, model and verl overrides (:func:`.settings.overrides`, :func:`.settings.prepare`;
  :func:`.settings.tiny_trainer_overrides`, also the step-cost benchmark's);
* :mod:`.runs` -- :class:`.runs.Run` (start/wait/kill one training), :func:`.runs.train`;
* :mod:`.cluster` -- :class:`.cluster.LocalCluster` (``ray start`` x 2, stop with leak checks);
* :mod:`.faults` -- :class:`.faults.Fault` (inject with a deadline, check the end against its bound),
  :func:`.faults.bound_s`, :func:`.faults.check_end`;
* :mod:`.planting` -- a callable planted in a checkpoint file (:func:`.planting.plant`), the refused resumes;
* :mod:`.scan` -- leak scans that prove they see (:class:`.scan.Watch`);
* :mod:`.checks`, :mod:`.continuation`, :mod:`.evaluation` -- what the runs must show;
* :mod:`.limits` -- the nested time limits; :mod:`.flows` -- the flows above;
* :mod:`.campaign` -- the random-kill campaign, :mod:`.invariants` -- what its final state must show.
"""
