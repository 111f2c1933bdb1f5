"""MATH-500 (the 500-problem MATH test subset), an evaluation set: ``<out-dir>/math500.parquet`` in verl's schema.

    python data_prep/math500.py --out-dir ~/data/ebpo [--local-path FILE] [--template dapo|boxed]

``--help`` lists every option; the conversion is :mod:`ebpo_verl.data.math500`."""

from ebpo_verl.data.math500 import main

if __name__ == "__main__":
    main(prog="python data_prep/math500.py")
