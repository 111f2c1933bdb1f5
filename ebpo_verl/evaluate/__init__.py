"""Evaluation stage: ``python -m ebpo_verl.evaluate generate|grade`` (the paper's protocol or verl's)."""
