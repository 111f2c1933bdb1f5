"""The Hydra config of ``ebpo-train`` (``ebpo_trainer.yaml``), a package so
that ``pkg://ebpo_verl.trainer.config`` resolves."""
