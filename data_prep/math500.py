"""MATH-500 (the 500-problem MATH test subset), an evaluation set: ``<out-dir>/math500.parquet`` in verl's schema.

``--help`` lists the options; the logic is :mod:`ebpo_verl.data.math500` (docs/data.md)."""

from ebpo_verl.data.math500 import main

if __name__ == "__main__":
    main(prog="python data_prep/math500.py")
