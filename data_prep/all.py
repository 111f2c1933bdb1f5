"""Every dataset of the paper (what the recipes run), one ``<out-dir>/<name>.parquet`` each (--help; docs/data.md)."""

from ebpo_verl.data.all import main

if __name__ == "__main__":
    main(prog="python data_prep/all.py")
