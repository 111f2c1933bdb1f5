"""OlympiadBench (674 open-ended competition problems), an evaluation set: ``olympiadbench.parquet`` in verl's schema.

    python data_prep/olympiadbench.py --out-dir ~/data/ebpo [--local-path FILE] [--template dapo|boxed]

``--help`` lists every option; the conversion is :mod:`ebpo_verl.data.olympiadbench`."""

from ebpo_verl.data.olympiadbench import main

if __name__ == "__main__":
    main(prog="python data_prep/olympiadbench.py")
