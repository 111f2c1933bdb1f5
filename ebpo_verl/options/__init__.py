"""The option-parsing helpers that every options class uses (the bottom layer: imports nothing of ebpo_verl)."""
