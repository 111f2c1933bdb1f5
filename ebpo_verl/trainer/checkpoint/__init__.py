"""What the package adds to verl's checkpoints, one job per module:

- :mod:`.state`: an estimator's running state in ``global_step_N/<state_file>``, restored under ``on_resume_mismatch``;
- :mod:`.resume`: the folders (save, resume, verl's tracker file) and the pre-flight's resume check;
- :mod:`.step_metrics`: the step's training metrics saved with its checkpoint;
- :mod:`.run_lock`: one training process per checkpoint folder and metrics log;
- :mod:`.trusted_load`: a resume loads data only unless ``trainer.trust_checkpoint``.
"""
