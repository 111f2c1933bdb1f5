"""MATH-500 (MATH test subset), an evaluation set: ``<out-dir>/math500.parquet`` (--help; docs/data.md)."""

from ebpo_verl.data.math500 import main

if __name__ == "__main__":
    main(prog="python data_prep/math500.py")
