"""AIME 2025 (30 problems), an evaluation set: ``<out-dir>/aime2025.parquet`` (--help; docs/data.md)."""

from ebpo_verl.data.aime2025 import main

if __name__ == "__main__":
    main(prog="python data_prep/aime2025.py")
