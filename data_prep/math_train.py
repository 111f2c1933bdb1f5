"""MATH train (7,500 problems, subject and level labels), a training set: ``math_train.parquet`` in verl's schema.

``--help`` lists the options; the logic is :mod:`ebpo_verl.data.math_train` (docs/data.md)."""

from ebpo_verl.data.math_train import main

if __name__ == "__main__":
    main(prog="python data_prep/math_train.py")
