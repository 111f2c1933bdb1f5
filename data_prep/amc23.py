"""AMC 2023 (40 problems), an evaluation set: ``<out-dir>/amc23.parquet`` in verl's schema (--help; docs/data.md)."""

from ebpo_verl.data.amc23 import main

if __name__ == "__main__":
    main(prog="python data_prep/amc23.py")
