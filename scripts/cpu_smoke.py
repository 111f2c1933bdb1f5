"""Thin entry point of the smoke run: ``python -m ebpo_verl.smoke`` (the harness lives in that package).

Kept for ``python scripts/cpu_smoke.py ...`` and for the tests that import ``prepare``, ``train`` and
``free_ports`` from here (tests/test_otb_trainer.py, tests/test_node_check.py).
"""

from ebpo_verl.smoke.__main__ import main
from ebpo_verl.smoke.cluster import free_ports
from ebpo_verl.smoke.reward import coin_score
from ebpo_verl.smoke.runs import train
from ebpo_verl.smoke.settings import prepare

__all__ = ["coin_score", "free_ports", "main", "prepare", "train"]

if __name__ == "__main__":
    main()
