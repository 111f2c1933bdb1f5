"""Dataset preparation for EBPO: one module per dataset writes ``<name>.parquet`` in verl's schema.

Training set: ``dapo_math`` (DAPO-Math-17k, de-duplicated), plus ``math_train`` (MATH train, with topic and
level labels). Evaluation sets (arXiv 2602.05165, Sec. 5): ``math500``, ``aime2024``, ``aime2025``,
``amc23``, ``olympiadbench``. ``data_prep.all`` prepares every one; ``label_topics`` and
``estimate_pass_rate`` add the labels the ordered (curriculum) runs sort by.
"""

DATASETS = ("dapo_math", "math_train", "math500", "aime2024", "aime2025", "amc23", "olympiadbench")
