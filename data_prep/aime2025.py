"""AIME 2025 (30 problems), an evaluation set: ``<out-dir>/aime2025.parquet`` in verl's schema.

    python data_prep/aime2025.py --out-dir ~/data/ebpo [--local-path FILE] [--template dapo|boxed]

``--help`` lists every option; the conversion is :mod:`ebpo_verl.data.aime2025`."""

from ebpo_verl.data.aime2025 import main

if __name__ == "__main__":
    main(prog="python data_prep/aime2025.py")
