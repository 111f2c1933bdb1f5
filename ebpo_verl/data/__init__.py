"""Dataset preparation for EBPO: one module per dataset writes ``<name>.parquet`` in verl's schema.

Training set: ``dapo_math`` (DAPO-Math-17k, de-duplicated), plus ``math_train`` (MATH train, with topic and
level labels). Evaluation sets (arXiv 2602.05165, Sec. 5): ``math500``, ``aime2024``, ``aime2025``,
``amc23``, ``olympiadbench``. ``ebpo_verl.data.all`` prepares every one; ``label_topics`` adds the topic labels of
ORDER=topic, :mod:`ebpo_verl.evaluate.pass_rate` (a generation job: ``evaluate`` imports ``data``, never the
reverse) the pass rates of ORDER=difficulty.
"""

DATASETS = ("dapo_math", "math_train", "math500", "aime2024", "aime2025", "amc23", "olympiadbench")
