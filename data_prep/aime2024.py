"""AIME 2024 (30 problems), an evaluation set: ``<out-dir>/aime2024.parquet`` (--help; docs/data.md)."""

from ebpo_verl.data.aime2024 import main

if __name__ == "__main__":
    main(prog="python data_prep/aime2024.py")
