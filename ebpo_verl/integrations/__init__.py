"""The package's estimators in trainers other than verl: :mod:`.trl` (Hugging Face TRL's ``GRPOTrainer``; install
``ebpo-verl[trl]``). Nothing here is imported by the verl path."""
