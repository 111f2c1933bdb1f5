"""A small-scale RLVR study on a CPU: verl's advantage estimators (and EBPO) training a tiny transformer on
verifiable arithmetic. ``python -m ebpo_verl.study --help``."""
