"""DAPO-Math-17k (de-duplicated by problem), the training set: ``<out-dir>/dapo_math.parquet`` in verl's schema.

``--help`` lists the options; the logic is :mod:`ebpo_verl.data.dapo_math` (docs/data.md)."""

from ebpo_verl.data.dapo_math import main

if __name__ == "__main__":
    main(prog="python data_prep/dapo_math.py")
