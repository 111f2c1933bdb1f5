"""Shim: ``python -m ebpo_verl.recipes.make_tables`` (kept for the checkout's earlier command lines)."""

import sys

from ebpo_verl.recipes.make_tables import main

if __name__ == "__main__":
    sys.exit(main())
