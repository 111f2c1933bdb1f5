"""Shim: ``python -m ebpo_verl.recipes.plot_dynamics`` (kept for the checkout's earlier command lines)."""

import sys

from ebpo_verl.recipes.plot_dynamics import main

if __name__ == "__main__":
    sys.exit(main())
