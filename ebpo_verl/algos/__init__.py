"""The math: the advantage estimators (EBPO, the v2 draft's baselines, DBB) and the curriculum's orderings.

torch and numpy only: nothing here imports verl, Ray or anything of ebpo_verl above :mod:`ebpo_verl.options`
(tests/test_imports.py checks it). An estimator's option declaration sits beside its math.
"""
