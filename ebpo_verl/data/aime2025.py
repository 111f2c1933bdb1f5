"""AIME 2025 (I and II, 30 problems), an evaluation set; same answer rules as :mod:`ebpo_verl.data.aime2024`.

Accepts ``yentinglin/aime_2025`` (``id, problem, answer``), ``opencompass/AIME2025`` (``question, answer``)
and ``MathArena/aime_2025`` (``problem_idx, problem, answer``) shaped files.
"""

from __future__ import annotations

from ebpo_verl.data.aime2024 import aime_example
from ebpo_verl.data.schema import Dataset

DATASET = Dataset("aime2025", "yentinglin/aime_2025", "train", aime_example, split="test")
prepare = DATASET.prepare
main = DATASET.main


if __name__ == "__main__":
    main()
