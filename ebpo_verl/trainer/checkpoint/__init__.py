"""What the package adds to verl's checkpoints, one job per module:

- :mod:`.state`: an estimator's running state in ``global_step_N/<state_file>`` (``ebpo_state.json``,
  ``spo_state.json``: each estimator's ``StateSpec``, :mod:`ebpo_verl.algos.registry`), saved atomically before verl's
  tracker file and restored under ``on_resume_mismatch``;
- :mod:`.resume`: the folders (where a step is saved, which one a run resumes from, verl's tracker file) and the
  pre-flight's resume check;
- :mod:`.step_metrics`: the step's training metrics saved with its checkpoint (logged on resume if the run died
  before verl's log call);
- :mod:`.run_lock`: one training process per checkpoint folder and metrics log.
- :mod:`.trusted_load`: a resume loads data only unless ``trainer.trust_checkpoint``: each file weights-only with
  its kind's allowlist (:mod:`ebpo_verl.compat.unpickling`), a strategy whose loader cannot be (Megatron's) refused.
"""
