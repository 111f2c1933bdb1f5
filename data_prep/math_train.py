"""MATH train (7,500 problems, subject and level labels), a training set: ``math_train.parquet`` (docs/data.md)."""

from ebpo_verl.data.math_train import main

if __name__ == "__main__":
    main(prog="python data_prep/math_train.py")
