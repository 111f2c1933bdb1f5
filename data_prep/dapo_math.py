"""DAPO-Math-17k (de-duplicated), the training set: ``<out-dir>/dapo_math.parquet`` (--help; docs/data.md)."""

from ebpo_verl.data.dapo_math import main

if __name__ == "__main__":
    main(prog="python data_prep/dapo_math.py")
