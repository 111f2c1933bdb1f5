"""Shim: ``python -m ebpo_verl.recipes.status_table`` (kept for the checkout's earlier command lines)."""

import sys

from ebpo_verl.recipes.status_table import main

if __name__ == "__main__":
    sys.exit(main())
