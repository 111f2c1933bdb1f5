"""MATH train (7,500 problems, subject and level labels), a training set: ``math_train.parquet`` in verl's schema.

    python data_prep/math_train.py --out-dir ~/data/ebpo [--local-path FILE] [--template dapo|boxed]

``--help`` lists every option; the conversion is :mod:`ebpo_verl.data.math_train`."""

from ebpo_verl.data.math_train import main

if __name__ == "__main__":
    main(prog="python data_prep/math_train.py")
