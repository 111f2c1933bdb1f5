"""Every dataset of the paper at once (what the recipes run), one ``<name>.parquet`` each in verl's schema.

    python data_prep/all.py --out-dir ~/data/ebpo [--local-dir ../shared/data] [--only math500 amc23]

``--help`` lists every option and the file names ``--local-dir`` expects; the logic is :mod:`ebpo_verl.data.all`."""

from ebpo_verl.data.all import main

if __name__ == "__main__":
    main(prog="python data_prep/all.py")
