"""OlympiadBench (674 open-ended competition problems), an evaluation set: ``olympiadbench.parquet`` in verl's schema.

``--help`` lists the options; the logic is :mod:`ebpo_verl.data.olympiadbench` (docs/data.md)."""

from ebpo_verl.data.olympiadbench import main

if __name__ == "__main__":
    main(prog="python data_prep/olympiadbench.py")
