"""DAPO-Math-17k (de-duplicated by problem), the training set: ``<out-dir>/dapo_math.parquet`` in verl's schema.

    python data_prep/dapo_math.py --out-dir ~/data/ebpo [--local-path FILE] [--template dapo|boxed]

``--help`` lists every option; the conversion is :mod:`ebpo_verl.data.dapo_math`."""

from ebpo_verl.data.dapo_math import main

if __name__ == "__main__":
    main(prog="python data_prep/dapo_math.py")
