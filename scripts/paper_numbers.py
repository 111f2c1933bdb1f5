"""The paper's numbers, for ``scripts/make_tables.py``: kept in :mod:`ebpo_verl.recipes.paper` (with the tables'
rows and labels); this module only re-exports them."""

from ebpo_verl.recipes.paper import BENCHMARKS, CONTRASTS, PAPER, PAPER_LABEL

__all__ = ["BENCHMARKS", "CONTRASTS", "PAPER", "PAPER_LABEL"]
