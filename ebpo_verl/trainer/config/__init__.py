"""The Hydra config of ``ebpo-train`` (``ebpo_trainer.yaml``, generated from the option declarations by
:mod:`.generate`), a package so that ``pkg://ebpo_verl.trainer.config`` resolves."""
