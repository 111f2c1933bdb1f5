"""OlympiadBench (674 open-ended problems), an evaluation set: ``olympiadbench.parquet`` (--help; docs/data.md)."""

from ebpo_verl.data.olympiadbench import main

if __name__ == "__main__":
    main(prog="python data_prep/olympiadbench.py")
