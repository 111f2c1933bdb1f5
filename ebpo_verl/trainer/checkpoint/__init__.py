"""What the package adds to verl's checkpoints, one job per module (its docstring says which): :mod:`.state`,
:mod:`.resume`, :mod:`.step_metrics`, :mod:`.run_lock`, :mod:`.trusted_load`."""
